//! The segment's peer channel where bytes come from the network. A message as an authenticated
//! peer could send it, once the channel has opened it: a message or a refusal with a reason,
//! never a panic, and a message decodes back from what it encodes to. And what a stranger sends
//! the downstream point: its preamble and first message, refused (never, without the key,
//! verified).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pirated::{
    psk::Psk,
    segment::{channel, wire::Message},
};

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = Message::decode(data) {
        assert_eq!(Message::decode(&message.encode()).as_ref(), Ok(&message), "{message:?} read back otherwise");
    }
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    if let Ok(first) = runtime.block_on(channel::read_first(&mut &data[..])) {
        assert!(channel::Responder::verify(&Psk::new([7; 32]), &first).is_err(), "a stranger's first message verified");
    }
});
