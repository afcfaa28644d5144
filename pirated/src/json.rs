//! JSON lines on stdout (`--output json`), written by a thread of their own behind a bounded
//! queue: a slow or stalled reader costs whole epochs of lines, counted, never the epoch loop;
//! a reader that closes stdout stops pirated cleanly.

use std::{
    io::{ErrorKind, Write},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{sync_channel, SyncSender, TrySendError},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// Epochs of lines waiting at most: beyond, an epoch's lines are dropped.
const QUEUE: usize = 4;

pub struct JsonLines {
    sender: Lines,
    writer: JoinHandle<()>,
}

/// A handle that queues lines for the writer, for a task besides the epoch loop (the segment's
/// intervals).
#[derive(Clone)]
pub struct Lines {
    queue: SyncSender<Vec<u8>>,
    closed: Arc<AtomicBool>,
}

/// What became of one epoch's lines.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The queue was full: the reader is behind by `QUEUE` epochs.
    Dropped,
    /// stdout was closed: nothing reads the lines any more.
    Closed,
}

impl JsonLines {
    pub fn spawn() -> std::io::Result<JsonLines> {
        let (queue, lines) = sync_channel::<Vec<u8>>(QUEUE);
        let closed = Arc::new(AtomicBool::new(false));
        let writer_closed = closed.clone();
        let writer = std::thread::Builder::new().name("json-lines".into()).spawn(move || {
            let mut out = std::io::stdout().lock();
            for epoch in lines {
                if let Err(e) = out.write_all(&epoch).and_then(|()| out.flush()) {
                    if e.kind() != ErrorKind::BrokenPipe {
                        tracing::warn!("writing JSON lines: {e}");
                    }
                    writer_closed.store(true, Ordering::Relaxed);
                    return;
                }
            }
        })?;
        Ok(JsonLines { sender: Lines { queue, closed }, writer })
    }

    /// Writes what is queued, waiting at most `patience` for a stalled reader, when pirated
    /// stops: its last epoch's lines are the partial epoch it closed.
    pub fn finish(self, patience: Duration) {
        drop(self.sender);
        let deadline = Instant::now() + patience;
        while !self.writer.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Queues one epoch's lines without waiting.
    pub fn send(&self, lines: Vec<u8>) -> Sent {
        self.sender.send(lines)
    }

    pub fn lines(&self) -> Lines {
        self.sender.clone()
    }
}

impl Lines {
    /// Queues lines without waiting.
    pub fn send(&self, lines: Vec<u8>) -> Sent {
        if self.closed.load(Ordering::Relaxed) {
            return Sent::Closed;
        }
        match self.queue.try_send(lines) {
            Ok(()) => Sent::Queued,
            Err(TrySendError::Full(_)) => Sent::Dropped,
            Err(TrySendError::Disconnected(_)) => Sent::Closed,
        }
    }
}
