//! What the library's unit tests share.

/// xorshift64*: the sequence is the seed's, so a property test's failure can be replayed.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Makes `at` a symbolic link to `target` as the OS allows; false (said on stderr) where it
/// cannot (Windows without the privilege), so a test of link refusals says it was not exercised
/// rather than fails. A directory link where `target`, read from `at`'s folder, is not a file.
pub(crate) fn symlink(
    target: impl AsRef<std::path::Path>,
    at: impl AsRef<std::path::Path>,
) -> bool {
    let (target, at) = (target.as_ref(), at.as_ref());
    #[cfg(unix)]
    let made = std::os::unix::fs::symlink(target, at);
    #[cfg(windows)]
    let made = {
        let resolved = at.parent().unwrap_or(at).join(target);
        if resolved.is_file() {
            std::os::windows::fs::symlink_file(target, at)
        } else {
            std::os::windows::fs::symlink_dir(target, at)
        }
    };
    made.map_err(|e| eprintln!("no link could be made here ({e}): not exercised"))
        .is_ok()
}
