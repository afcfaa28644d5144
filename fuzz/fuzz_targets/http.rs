//! `/metrics`' server over any bytes a client sends: served, refused or closed, never a panic,
//! and never held past its deadlines.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pirated::metrics::http::{serve_connection, Exposed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    runtime.block_on(async {
        let exposed = Exposed::default();
        exposed.set("# TYPE pirated_requests counter\npirated_requests_total 3\n# EOF\n".into());
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve_connection(server, exposed));
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut answer = Vec::new();
        let _ = client.read_to_end(&mut answer).await;
        let _ = served.await.expect("the connection's task panicked");
    });
});
