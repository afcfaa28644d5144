//! Spreading an epoch's CPU work (per-flow estimates, per-server quantiles) over every CPU: the
//! daemon runs it on a blocking thread, and its cost grows with the flow table.

/// `each` over `items` on every CPU, in chunks; the results in the items' order. The items stay
/// where they are: with a million flows, moving them into chunks and back costs more than
/// estimating them.
pub fn map<T: Sync, R: Send>(items: &[T], each: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = items.len().div_ceil(threads).max(1);
    let each = &each;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(per_thread)
            .map(|chunk| scope.spawn(move || chunk.iter().map(each).collect::<Vec<R>>()))
            .collect();
        let mut out = Vec::with_capacity(items.len());
        for h in handles {
            out.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        out
    })
}
