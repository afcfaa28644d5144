//! The capture reader over any bytes: frames or a clear error, never a panic or a hang.
#![no_main]

use std::{io::Cursor, path::Path};

use libfuzzer_sys::fuzz_target;
use pirated::capture::CaptureReader;

fuzz_target!(|data: &[u8]| {
    let Ok(mut reader) = CaptureReader::new(Box::new(Cursor::new(data.to_vec())), Path::new("fuzz")) else { return };
    while let Ok(Some((_, frame))) = reader.frame() {
        assert!(frame.len() >= 14, "a frame shorter than its Ethernet header");
    }
});
