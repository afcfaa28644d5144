//! The segment's peer messages, as an authenticated peer could send them: a kind, an interval and
//! any body, framed under the key (so that the body parser is reached, past the MAC). A message
//! or a refusal with a reason, never a panic; a message read encodes back to what reads the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pirated::segment::wire::{frame, Message, MAX_BODY};

const KEY: &[u8] = b"sixteen bytes at least";

fuzz_target!(|data: &[u8]| {
    let (Some(&kind), Some(interval)) = (data.first(), data.get(1..9)) else { return };
    let interval = u64::from_le_bytes(interval.try_into().unwrap());
    let framed = frame(kind, interval, &data[9..], KEY);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let read = |bytes: &[u8]| runtime.block_on(Message::read(&mut &bytes[..], KEY, MAX_BODY));
    if let Ok(message) = read(&framed) {
        assert_eq!(read(&message.encode(KEY)).as_ref(), Ok(&message), "{message:?} read back otherwise");
    }
});
