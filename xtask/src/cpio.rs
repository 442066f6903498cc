//! A writer for the initramfs format: cpio "newc" (SVR4, no CRC), uncompressed.
pub struct Cpio {
    bytes: Vec<u8>,
    next_inode: u32,
}

const DIR: u32 = 0o040_000;
const FILE: u32 = 0o100_000;
const SYMLINK: u32 = 0o120_000;
const CHAR_DEVICE: u32 = 0o020_000;

impl Cpio {
    pub fn new() -> Self {
        Self {
            bytes: Vec::new(),
            next_inode: 1,
        }
    }

    pub fn dir(&mut self, path: &str) {
        self.entry(path, DIR | 0o755, (0, 0), b"");
    }

    /// `path` and each directory above it (`a`, `a/b`, `a/b/c`); a directory the archive
    /// already holds may come again (the kernel's mkdir fails with EEXIST, which it ignores).
    pub fn dirs(&mut self, path: &str) {
        let mut at = 0;
        while let Some(slash) = path[at..].find('/') {
            self.dir(&path[..at + slash]);
            at += slash + 1;
        }
        self.dir(path);
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.entry(path, FILE | mode, (0, 0), data);
    }

    pub fn symlink(&mut self, path: &str, target: &str) {
        self.entry(path, SYMLINK | 0o777, (0, 0), target.as_bytes());
    }

    pub fn char_device(&mut self, path: &str, major: u32, minor: u32) {
        self.entry(path, CHAR_DEVICE | 0o600, (major, minor), b"");
    }

    /// Appends the trailer and returns the archive.
    pub fn finish(mut self) -> Vec<u8> {
        self.next_inode = 0;
        self.entry("TRAILER!!!", 0, (0, 0), b"");
        self.bytes
    }

    fn entry(&mut self, path: &str, mode: u32, (rmajor, rminor): (u32, u32), data: &[u8]) {
        let nlink = if mode & DIR == DIR { 2 } else { 1 };
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            u32::try_from(data.len()).expect("initramfs member over 4 GiB"),
            0, // devmajor
            0, // devminor
            rmajor,
            rminor,
            u32::try_from(path.len() + 1).expect("path length"),
            0, // check
        ];
        self.next_inode += 1;
        self.bytes.extend_from_slice(b"070701");
        for field in fields {
            self.bytes
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(path.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_and_alignment() {
        let mut cpio = Cpio::new();
        cpio.file("init", 0o755, b"#!/bin/sh\n");
        let bytes = cpio.finish();
        assert!(bytes.starts_with(b"07070100000001000081ed"));
        // 110-byte header + "init\0" padded to 116, then 10 data bytes padded to 12.
        assert_eq!(&bytes[110..115], b"init\0");
        assert_eq!(&bytes[116..126], b"#!/bin/sh\n");
        assert_eq!(&bytes[128..134], b"070701");
        assert_eq!(bytes.len() % 4, 0);
    }

    #[test]
    fn dirs_makes_every_ancestor_first() {
        let mut cpio = Cpio::new();
        cpio.dirs("work/t/release");
        let bytes = String::from_utf8_lossy(&cpio.finish()).into_owned();
        let at = |name: &str| bytes.find(&format!("{name}\0")).unwrap();
        assert!(at("work") < at("work/t") && at("work/t") < at("work/t/release"));
    }
}
