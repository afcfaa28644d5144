//! Work that may wait: an interval's close (banks and flow tables read, reconciled, reported)
//! takes a CPU for milliseconds, tens of them on a busy host, while the tasks carrying sampled
//! references' times must run within a ms of them. A close runs on a thread of its own that
//! the scheduler favours less than pirated's others, so that those tasks preempt it.

use std::sync::Mutex;

/// How much nicer than the caller the background thread is.
const NICER_BY: i32 = 10;

/// `f` on a thread of its own at a lower priority, the caller waiting for it (in an async task,
/// inside `block_in_place`). Where no thread can be started, `f` runs on the caller's.
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let work = Mutex::new(Some(f));
    let take = || work.lock().unwrap_or_else(|p| p.into_inner()).take();
    let ran = std::thread::scope(|s| {
        let thread = std::thread::Builder::new().name("pirated-close".into()).spawn_scoped(s, || {
            lower();
            take().map(|f| f())
        });
        thread.ok().map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    });
    match ran.flatten() {
        Some(r) => r,
        None => take().map(|f| f()).expect("the work ran on neither thread"),
    }
}

/// Makes the calling thread `NICER_BY` nicer (a thread's niceness is its own on Linux). Failing,
/// it keeps the caller's: the work is then only as urgent as the rest.
fn lower() {
    // SAFETY: plain calls about the calling thread.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid);
        if *libc::__errno_location() == 0 {
            libc::setpriority(libc::PRIO_PROCESS, tid, (nice + NICER_BY).min(19));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work runs once, on another thread at a lower priority, its result and its borrows
    /// the caller's.
    #[test]
    fn runs_the_work_on_a_nicer_thread() {
        let here = std::thread::current().id();
        let mut borrowed = 1;
        // SAFETY: getpriority about the calling thread.
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        let (before, (there, after)) = (
            nice(),
            run(|| {
                borrowed += 1;
                (std::thread::current().id(), nice())
            }),
        );
        assert_ne!(there, here);
        assert_eq!(after, (before + NICER_BY).min(19));
        assert_eq!((borrowed, nice()), (2, before));
    }
}
