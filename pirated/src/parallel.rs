//! Spreading an epoch's CPU work (per-flow estimates, per-server quantiles) over every CPU: the
//! daemon runs it on a blocking thread, and its cost grows with the flow table.

/// `each` over `items` on every CPU, in chunks; the results in the items' order.
pub fn map<T: Sync, R: Send>(items: &[T], each: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut out = Vec::new();
    map_into(items, &mut out, each);
    out
}

/// [`map`] into `out`, replacing what it held and reusing its memory: with a million flows, the
/// memory of a new vector costs more to fault in than the estimates written into it. The items
/// stay where they are, for the same reason.
pub fn map_into<T: Sync, R: Send>(items: &[T], out: &mut Vec<R>, each: impl Fn(&T) -> R + Sync) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = items.len().div_ceil(threads).max(1);
    out.clear();
    out.reserve(items.len());
    let each = &each;
    std::thread::scope(|scope| {
        let slots = &mut out.spare_capacity_mut()[..items.len()];
        let handles: Vec<_> = items
            .chunks(per_thread)
            .zip(slots.chunks_mut(per_thread))
            .map(|(chunk, slots)| {
                scope.spawn(move || chunk.iter().zip(slots).for_each(|(item, slot)| _ = slot.write(each(item))))
            })
            .collect();
        for h in handles {
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
    });
    // SAFETY: every thread finished (a panic was resumed above), and the chunks of
    // `items.len()` slots were each written once.
    unsafe { out.set_len(items.len()) };
}
