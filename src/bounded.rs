//! Copies whose size the source does not decide: an archive member streamed through a caller's
//! buffer, stopped as soon as it passes what it declares or a cap (wheels, runtime archives).

use std::io::{Read, Write};

use sha2::{Digest, Sha256};

/// Why a member's copy stopped.
#[derive(Debug)]
pub enum Overrun {
    /// More came out than the member's header declares.
    Declared,
    /// More came out than the limit given.
    Cap,
    Io(std::io::Error),
}

/// Copies one archive member into `out` through `buf`, hashing what passes when asked, and
/// stops as soon as more than `declared` or more than `cap` bytes come out (one byte past the
/// smaller is read to tell). Returns the bytes copied.
pub fn copy_member(
    src: &mut dyn Read,
    declared: u64,
    cap: u64,
    out: &mut dyn Write,
    mut hash: Option<&mut Sha256>,
    buf: &mut [u8],
) -> Result<u64, Overrun> {
    let limit = declared.min(cap);
    let mut n = 0u64;
    loop {
        let want = (limit - n.min(limit))
            .saturating_add(1)
            .min(buf.len() as u64) as usize;
        let got = match src.read(&mut buf[..want]) {
            Ok(0) => return Ok(n),
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Overrun::Io(e)),
        };
        n += got as u64;
        if n > declared {
            return Err(Overrun::Declared);
        }
        if n > cap {
            return Err(Overrun::Cap);
        }
        if let Some(h) = hash.as_deref_mut() {
            h.update(&buf[..got]);
        }
        out.write_all(&buf[..got]).map_err(Overrun::Io)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that yields `n` zeros, a few at a time.
    struct Zeros(u64);

    impl Read for Zeros {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let k = buf.len().min(1000).min(self.0 as usize);
            buf[..k].fill(0);
            self.0 -= k as u64;
            Ok(k)
        }
    }

    #[test]
    fn a_member_stops_at_its_declared_size_or_the_cap() {
        let mut buf = [0u8; 4096];
        let mut out = Vec::new();
        let mut h = Sha256::new();
        let n = copy_member(
            &mut Zeros(5000),
            5000,
            10_000,
            &mut out,
            Some(&mut h),
            &mut buf,
        );
        assert_eq!(n.unwrap(), 5000);
        assert_eq!(h.finalize(), Sha256::digest([0u8; 5000]));

        // Declares less than it holds: stopped one byte past what it declares.
        let mut out = Vec::new();
        let e = copy_member(&mut Zeros(1 << 30), 5000, 1 << 20, &mut out, None, &mut buf);
        assert!(matches!(e, Err(Overrun::Declared)), "{e:?}");
        assert_eq!(out.len(), 5000);

        // Within what it declares, past the cap: stopped at the cap.
        let mut out = Vec::new();
        let e = copy_member(&mut Zeros(1 << 30), 1 << 30, 3000, &mut out, None, &mut buf);
        assert!(matches!(e, Err(Overrun::Cap)), "{e:?}");
        assert_eq!(out.len(), 3000);
    }
}
