//! The segment's pre-shared key: 256 random bits, written by `pirated keygen` as 64 hex digits
//! into a file that only its owner may read. The key authenticates the points to each other
//! (the channel's handshake mixes it in; RLI's reference tags use a key derived from it), so
//! it is kept out of the configuration file (often readable by all), never printed, and zeroed
//! when dropped.

use std::{
    io::{Read, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::Path,
};

use anyhow::{bail, Context};
use zeroize::Zeroizing;

/// Bytes of a key.
pub const BYTES: usize = 32;

/// A pre-shared key, zeroed on drop.
pub struct Psk(Zeroizing<[u8; BYTES]>);

impl Psk {
    pub fn new(bytes: [u8; BYTES]) -> Psk {
        Psk(Zeroizing::new(bytes))
    }

    /// A fresh key from the kernel's random source.
    pub fn generate() -> std::io::Result<Psk> {
        let mut key = Psk::new([0; BYTES]);
        crate::rng::fill_random(&mut *key.0)?;
        Ok(key)
    }

    /// A key for `purpose` alone, derived from this one (BLAKE2s keyed by it, over the
    /// purpose): knowing a derived key tells nothing of this one or of another purpose's.
    pub fn derive(&self, purpose: &str) -> Zeroizing<[u8; BYTES]> {
        use blake2::digest::{KeyInit, Mac};
        let mut mac = <blake2::Blake2sMac256 as KeyInit>::new_from_slice(&*self.0).expect("a 32-byte key fits BLAKE2s");
        mac.update(purpose.as_bytes());
        Zeroizing::new(mac.finalize().into_bytes().into())
    }

    pub fn bytes(&self) -> &[u8; BYTES] {
        &self.0
    }

    /// The key in `path`, which must be a regular file owned by this user (or root) that no
    /// one else may read or write, holding 64 hex digits (surrounding whitespace aside).
    pub fn read(path: &Path) -> anyhow::Result<Psk> {
        let shown = path.display();
        // Not blocking on a FIFO, nor taking a terminal: what it is is checked next.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .with_context(|| format!("segment.key_file {shown}"))?;
        let meta = file.metadata().with_context(|| format!("segment.key_file {shown}"))?;
        if !meta.is_file() {
            bail!("segment.key_file {shown} is not a regular file");
        }
        if meta.mode() & 0o077 != 0 {
            bail!(
                "segment.key_file {shown} has mode {:04o}: others than its owner may read or change it; \
                 `chmod 600 {shown}`",
                meta.mode() & 0o7777
            );
        }
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid && meta.uid() != 0 {
            bail!("segment.key_file {shown} belongs to uid {}, neither pirated's user ({euid}) nor root", meta.uid());
        }
        // Room for all that is read: a buffer that grew would leave the key behind unzeroed.
        let mut text = Zeroizing::new(Vec::with_capacity(4 * BYTES + 1));
        (&mut file).take(4 * BYTES as u64).read_to_end(&mut text).with_context(|| format!("reading {shown}"))?;
        Psk::parse(text.trim_ascii()).with_context(|| format!("segment.key_file {shown}"))
    }

    /// Writes a fresh key to `path`, a file that must not exist yet, readable by its owner only.
    pub fn write_new(path: &Path) -> anyhow::Result<()> {
        let shown = path.display();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .with_context(|| format!("creating {shown} (an existing key is not overwritten)"))?;
        let key = Psk::generate().context("drawing a key from the kernel's random source")?;
        let mut text = Zeroizing::new(String::with_capacity(2 * BYTES + 1));
        for b in key.bytes() {
            text.push(char::from_digit(u32::from(b >> 4), 16).unwrap());
            text.push(char::from_digit(u32::from(b & 0xf), 16).unwrap());
        }
        text.push('\n');
        file.write_all(text.as_bytes()).and_then(|()| file.sync_all()).with_context(|| format!("writing {shown}"))
    }

    fn parse(hex: &[u8]) -> anyhow::Result<Psk> {
        if hex.len() != 2 * BYTES || !hex.iter().all(u8::is_ascii_hexdigit) {
            bail!(
                "holds {} characters; a key is {} hex digits (256 random bits), as `pirated keygen FILE` writes",
                hex.len(),
                2 * BYTES
            );
        }
        let mut key = Psk::new([0; BYTES]);
        for (byte, pair) in key.0.iter_mut().zip(hex.chunks(2)) {
            let digit = |c: u8| (c as char).to_digit(16).unwrap() as u8;
            *byte = digit(pair[0]) << 4 | digit(pair[1]);
        }
        if key.0.iter().all(|&b| b == key.0[0]) {
            bail!("holds one byte repeated, not a random key: write one with `pirated keygen FILE`");
        }
        Ok(key)
    }
}

impl std::fmt::Debug for Psk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Psk(set)")
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn dir() -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pirated-key-{}-{:?}", std::process::id(), std::thread::current().id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A key written by keygen reads back, owner-only; keygen does not overwrite; two keys differ.
    #[test]
    fn a_written_key_reads_back_and_is_not_overwritten() {
        let dir = dir();
        let (a, b) = (dir.join("a"), dir.join("b"));
        Psk::write_new(&a).unwrap();
        Psk::write_new(&b).unwrap();
        assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o777, 0o600);
        assert_ne!(Psk::read(&a).unwrap().bytes(), Psk::read(&b).unwrap().bytes());
        let before = std::fs::read(&a).unwrap();
        assert!(Psk::write_new(&a).is_err());
        assert_eq!(std::fs::read(&a).unwrap(), before);
        assert_eq!(format!("{:?}", Psk::read(&a).unwrap()), "Psk(set)");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A key others may read, too short, not hex or one byte repeated is refused, saying why.
    #[test]
    fn weak_or_exposed_keys_are_refused() {
        let dir = dir();
        let path = dir.join("key");
        let refused = |text: &str, mode: u32, why: &str| {
            let _ = std::fs::remove_file(&path);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = format!("{:#}", Psk::read(&path).unwrap_err());
            assert!(e.contains(why), "{text:?} {mode:o}: {e}");
        };
        let good = "0123456789abcdef".repeat(4);
        refused(&good, 0o640, "mode 0640");
        refused(&good, 0o604, "chmod 600");
        refused("sixteen bytes at least", 0o600, "64 hex digits");
        refused(&good.replace('0', "g"), 0o600, "64 hex digits");
        refused(&"ab".repeat(32), 0o400, "one byte repeated");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, format!("  {}\n", good.to_uppercase())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Psk::read(&path).unwrap().bytes()[..2], [0x01, 0x23]);
        assert!(format!("{:#}", Psk::read(&dir).unwrap_err()).contains("not a regular file"));
        let fifo = std::ffi::CString::new(dir.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(format!("{:#}", Psk::read(&dir.join("fifo")).unwrap_err()).contains("not a regular file"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
