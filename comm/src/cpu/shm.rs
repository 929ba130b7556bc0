//! Broadcasts through shared memory when every rank of a ring is on one host.
//!
//! The TCP ring relays a broadcast process to process: with `n` receivers on
//! one machine every byte crosses the kernel `2n` times. When the ranks share a
//! `/dev/shm`, the root instead copies the buffer once into a segment every
//! rank has mapped, and each receiver copies it out once; the ring carries
//! only the two barriers around it (data ready; read, so the segment may be
//! written again). Every wait stays bounded by the ring's timeout, and an
//! aborted ring fails these barriers like any other collective.
//!
//! Whether the ranks share memory is not guessed from host names (test hosts
//! are network namespaces of one machine; a container may have its own
//! `/dev/shm`): at connect time rank 0 creates a 0600 file in `/dev/shm` holding
//! a random nonce and sends its name over the ring; every other rank opens it
//! and compares the nonce, and the ranks agree (an all-reduce of the results)
//! to use it only when all of them can. Rank 0 then unlinks the file: the
//! segment lives while the ranks hold it open, and nothing is left behind
//! when a process dies.
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Where segments are made: a tmpfs shared by the processes of one host.
pub const SHM_DIR: &str = "/dev/shm";

/// Bytes of the nonce that proves a rank opened rank 0's segment.
pub const NONCE_BYTES: usize = 16;

/// A file in `/dev/shm` mapped into this process.
pub struct Segment {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value and only touched through `&mut self`.
unsafe impl Send for Segment {}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("len", &self.len).finish()
    }
}

impl Segment {
    /// Rank 0: a new segment holding `nonce`, at a fresh name under [`SHM_DIR`] (mode 0600).
    pub fn create(nonce: &[u8; NONCE_BYTES]) -> std::io::Result<(Segment, PathBuf)> {
        let dir = Path::new(SHM_DIR);
        if !dir.is_dir() {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "no /dev/shm on this host"));
        }
        let name = dir.join(format!("rlmesh-ring-{}-{}", std::process::id(), hex(&nonce[..8])));
        let mut f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode_0600().open(&name)?;
        f.write_all(nonce)?;
        let fd = OwnedFd::from(f);
        Ok((Segment { fd, ptr: std::ptr::null_mut(), len: 0 }, name))
    }

    /// Another rank: opens `path` and checks it holds `nonce`.
    pub fn open(path: &Path, nonce: &[u8; NONCE_BYTES]) -> std::io::Result<Segment> {
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let mut found = [0u8; NONCE_BYTES];
        f.read_exact(&mut found)?;
        if &found != nonce {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the segment holds another nonce"));
        }
        Ok(Segment { fd: OwnedFd::from(f), ptr: std::ptr::null_mut(), len: 0 })
    }

    /// Rank 0: makes the segment at least `len` bytes long (before it writes).
    pub fn grow(&mut self, len: usize) -> std::io::Result<()> {
        // SAFETY: a valid fd; ftruncate only changes the file's size.
        if len > self.file_len()? && unsafe { libc::ftruncate(self.fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.map(len)
    }

    /// Maps at least `len` bytes (the file must be that long: rank 0 grew it).
    pub fn map(&mut self, len: usize) -> std::io::Result<()> {
        if len <= self.len {
            return Ok(());
        }
        self.unmap();
        // SAFETY: a shared mapping of our own fd, `len` bytes the file holds.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, self.fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        (self.ptr, self.len) = (p as *mut u8, len);
        Ok(())
    }

    /// The first `len` mapped bytes.
    pub fn bytes(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.len, "the segment is mapped for {} bytes, {len} asked", self.len);
        if len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` maps `self.len` bytes; the borrow of self keeps the mapping alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    fn file_len(&self) -> std::io::Result<usize> {
        // SAFETY: fstat into a zeroed struct of the right type.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(st.st_size as usize)
    }

    fn unmap(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: exactly the mapping made in `map`.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
            (self.ptr, self.len) = (std::ptr::null_mut(), 0);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unmap();
    }
}

/// A fresh nonce from the kernel's random source.
pub fn nonce() -> std::io::Result<[u8; NONCE_BYTES]> {
    let mut n = [0u8; NONCE_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

/// Removes a segment's name (the mapping lives on while open).
pub fn unlink(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: a NUL-terminated path.
        unsafe { libc::unlink(c.as_ptr()) };
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `OpenOptions` with mode 0600 on create.
trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_shared_between_two_mappings_and_checked_by_its_nonce() {
        let n = nonce().unwrap();
        let (mut root, path) = Segment::create(&n).unwrap();
        let mut other = Segment::open(&path, &n).unwrap();
        assert!(Segment::open(&path, &[0u8; NONCE_BYTES]).is_err(), "another nonce is refused");
        unlink(&path);
        assert!(!path.exists(), "nothing left behind once unlinked");
        root.grow(1 << 20).unwrap();
        root.bytes(1 << 20).iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        other.map(1 << 20).unwrap();
        assert!(other.bytes(1 << 20).iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
        // Growing keeps what was written.
        root.grow(3 << 20).unwrap();
        other.map(3 << 20).unwrap();
        assert_eq!(other.bytes(3 << 20)[1000], (1000 % 251) as u8);
    }
}
