//! Spreading an epoch's CPU work (per-flow estimates, per-server quantiles, the per-flow
//! histogram) over every CPU: the daemon runs it on a blocking thread, and its cost grows with
//! the flow table.

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
    fold_into(items, out, || (), |(), item| each(item));
}

/// [`map_into`], each thread also folding its items into an accumulator (`init()` to start):
/// the accumulators, in the chunks' order.
pub fn fold_into<T: Sync, R: Send, A: Send>(
    items: &[T],
    out: &mut Vec<R>,
    init: impl Fn() -> A + Sync,
    each: impl Fn(&mut A, &T) -> R + Sync,
) -> Vec<A> {
    let per_thread = per_thread(items.len());
    out.clear();
    out.reserve(items.len());
    let slots = &mut out.spare_capacity_mut()[..items.len()];
    let accumulators = on_every_cpu(items.chunks(per_thread).zip(slots.chunks_mut(per_thread)), |(chunk, slots)| {
        let mut acc = init();
        chunk.iter().zip(slots).for_each(|(item, slot)| _ = slot.write(each(&mut acc, item)));
        acc
    });
    // SAFETY: every thread finished (a panic was resumed), and the chunks of `items.len()`
    // slots were each written once.
    unsafe { out.set_len(items.len()) };
    accumulators
}

/// `a` and `b` at once, `b` on a thread of its own (two independent steps of an epoch); a panic
/// in `b` is resumed here.
pub fn join<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    std::thread::scope(|scope| {
        let b = scope.spawn(b);
        let a = a();
        (a, b.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

/// `each` over one chunk of `items` per CPU; the results in the chunks' order.
pub fn chunks<T: Sync, R: Send>(items: &[T], each: impl Fn(&[T]) -> R + Sync) -> Vec<R> {
    on_every_cpu(items.chunks(per_thread(items.len())), each)
}

/// Items per chunk for one chunk per CPU.
fn per_thread(items: usize) -> usize {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    items.div_ceil(threads).max(1)
}

/// `each` over `parts`, each on a thread of its own; a panic in one is resumed here.
pub fn on_every_cpu<P: Send, R: Send>(parts: impl Iterator<Item = P>, each: impl Fn(P) -> R + Sync) -> Vec<R> {
    let each = &each;
    std::thread::scope(|scope| {
        let handles: Vec<_> = parts.map(|part| scope.spawn(move || each(part))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}
