//! The state as a file, for a paused or snapshotted session to outlive its process: a
//! versioned header with the key of the image it fits, a zstd-compressed body, a SHA-256 over
//! all. Decoding trusts nothing: sizes are bounded before anything is allocated for them, and
//! every way a file can be wrong is an error, never a panic.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::ops::Range;

use sha2::{Digest, Sha256};

use super::pages::{PAGE, byte_range};
use super::{GlobalValue, InstanceState};

/// The largest memory a state may describe: a 32-bit linear memory's.
const MAX_MEMORY: u64 = 1 << 32;

/// Room for everything but the pages in a decoded body (globals, metadata, run tables).
const BODY_SLACK: u64 = 64 << 20;

/// The longest metadata key or value.
const MAX_META: usize = 1 << 20;

const MAGIC: &[u8; 8] = b"WBXSTATE";
const FORMAT_VERSION: u32 = 1;
/// Fast over ratio: pausing is on a session's path, and most of a heap compresses anyway.
const ZSTD_LEVEL: i32 = 1;
const CHECKSUM: usize = 32;

/// What a state must have been captured from: the image (its module hash), the wasmtime that
/// ran it and the language.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateKey {
    pub image: String,
    pub wasmtime: String,
    pub language: String,
}

impl StateKey {
    /// A key under this build's wasmtime.
    pub fn new(image: impl Into<String>, language: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            wasmtime: crate::engine::cache::wasmtime_version().to_string(),
            language: language.into(),
        }
    }
}

impl std::fmt::Display for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} image {} under wasmtime {}",
            self.language, self.image, self.wasmtime
        )
    }
}

/// Why a state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("not a wasmbox state file")]
    NotAState,
    #[error(
        "state file format {found} is not supported (this build reads format {FORMAT_VERSION})"
    )]
    Version { found: u32 },
    #[error("the state file is corrupted or truncated (its checksum does not match)")]
    Corrupted,
    #[error("the state is from another image: it was saved from {found}, and this is {expected}")]
    OtherImage {
        found: Box<StateKey>,
        expected: Box<StateKey>,
    },
    #[error("malformed state file: {0}")]
    Malformed(String),
}

fn malformed(what: impl Into<String>) -> StateError {
    StateError::Malformed(what.into())
}

/// Little-endian fields written into the compressed body.
struct Out<W: Write>(W);

impl<W: Write> Out<W> {
    fn bytes(&mut self, b: &[u8]) {
        self.0.write_all(b).expect("writing to memory");
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(u32::try_from(s.len()).expect("a string under 4 GiB"));
        self.bytes(s.as_bytes());
    }
    fn runs(&mut self, runs: &[Range<u64>]) {
        self.u32(u32::try_from(runs.len()).expect("runs of a 4 GiB memory"));
        for r in runs {
            self.u64(r.start);
            self.u64(r.end - r.start);
        }
    }
}

/// Fields read back from the body; a short read is a malformed body.
struct In<R: Read>(R);

impl<R: Read> In<R> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], StateError> {
        let mut b = [0; N];
        self.0.read_exact(&mut b).map_err(body_error)?;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, StateError> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, StateError> {
        self.array().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, StateError> {
        self.array().map(u64::from_le_bytes)
    }
    /// `n` bytes, allocated as they arrive (not from the declared length).
    fn vec(&mut self, n: u64) -> Result<Vec<u8>, StateError> {
        let mut v = Vec::with_capacity(n.min(16 << 20) as usize);
        (&mut self.0)
            .take(n)
            .read_to_end(&mut v)
            .map_err(body_error)?;
        if v.len() as u64 != n {
            return Err(malformed("the body ends early"));
        }
        Ok(v)
    }
    fn str(&mut self, max: usize) -> Result<String, StateError> {
        let n = self.u32()?;
        if n as usize > max {
            return Err(malformed(format!("a {n}-byte string")));
        }
        String::from_utf8(self.vec(n.into())?).map_err(|_| malformed("a string is not UTF-8"))
    }
    /// Runs of host pages, ascending and apart, within `pages`.
    fn runs(&mut self, pages: u64) -> Result<Vec<Range<u64>>, StateError> {
        let n = self.u32()?;
        let mut runs = Vec::with_capacity(n.min(1 << 16) as usize);
        let mut end = 0;
        for _ in 0..n {
            let start = self.u64()?;
            let len = self.u64()?;
            if start < end || len == 0 || len > pages || start > pages - len {
                return Err(malformed("page runs out of order or past the memory"));
            }
            end = start + len;
            runs.push(start..end);
        }
        Ok(runs)
    }
}

fn body_error(e: std::io::Error) -> StateError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => malformed("the body ends early"),
        _ => malformed(format!("the body does not decompress: {e}")),
    }
}

impl InstanceState {
    /// The state as a file: magic, format version and `key`, then the body compressed with
    /// zstd, then SHA-256 of all that.
    pub fn encode(&self, key: &StateKey) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() / 2 + 4096);
        out.extend_from_slice(MAGIC);
        let mut header = Out(&mut out);
        header.u32(FORMAT_VERSION);
        header.str(&key.image);
        header.str(&key.wasmtime);
        header.str(&key.language);
        let mut z = zstd::stream::write::Encoder::new(&mut out, ZSTD_LEVEL).expect("zstd encoder");
        self.write_body(&mut z);
        z.finish().expect("zstd to memory");
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    fn write_body(&self, w: impl Write) {
        let mut body = Out(w);
        body.u64(self.page_size);
        body.u64(self.memory_pages);
        body.u64(self.clock_ns);
        body.u32(u32::try_from(self.meta.len()).expect("metadata entries"));
        for (k, v) in &self.meta {
            debug_assert!(
                k.len().max(v.len()) <= MAX_META,
                "metadata too big to read back"
            );
            body.str(k);
            body.str(v);
        }
        body.u32(u32::try_from(self.globals.len()).expect("globals"));
        for &(index, value) in &self.globals {
            body.u32(index);
            match value {
                GlobalValue::I32(v) => {
                    body.bytes(&[0]);
                    body.bytes(&v.to_le_bytes());
                }
                GlobalValue::I64(v) => {
                    body.bytes(&[1]);
                    body.bytes(&v.to_le_bytes());
                }
                GlobalValue::F32(v) => {
                    body.bytes(&[2]);
                    body.bytes(&v.to_le_bytes());
                }
                GlobalValue::F64(v) => {
                    body.bytes(&[3]);
                    body.bytes(&v.to_le_bytes());
                }
                GlobalValue::V128(v) => {
                    body.bytes(&[4]);
                    body.bytes(&v.to_le_bytes());
                }
            }
        }
        body.runs(&self.zeros);
        body.runs(&self.runs);
        body.bytes(&self.data);
    }

    /// Reads a state [`InstanceState::encode`] wrote for `expected`'s image. Sizes in the file
    /// are checked against bounds before anything is allocated for them.
    pub fn decode(bytes: &[u8], expected: &StateKey) -> Result<Self, StateError> {
        if bytes.len() < MAGIC.len() + 4 || &bytes[..MAGIC.len()] != MAGIC {
            return Err(StateError::NotAState);
        }
        let found = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if found != FORMAT_VERSION {
            return Err(StateError::Version { found });
        }
        let Some(split) = bytes.len().checked_sub(CHECKSUM).filter(|&n| n >= 12) else {
            return Err(StateError::Corrupted);
        };
        let (signed, sum) = bytes.split_at(split);
        if Sha256::digest(signed).as_slice() != sum {
            return Err(StateError::Corrupted);
        }

        let mut header = In(&signed[12..]);
        let key = StateKey {
            image: header.str(4096)?,
            wasmtime: header.str(4096)?,
            language: header.str(4096)?,
        };
        if key != *expected {
            return Err(StateError::OtherImage {
                found: Box::new(key),
                expected: Box::new(expected.clone()),
            });
        }
        let decoder = zstd::stream::read::Decoder::with_buffer(header.0)
            .map_err(|e| malformed(format!("the body does not decompress: {e}")))?;
        let mut body = In(decoder.take(MAX_MEMORY + BODY_SLACK));
        let page_size = body.u64()?;
        let memory_pages = body.u64()?;
        if !page_size.is_power_of_two() || page_size > 1 << 16 {
            return Err(malformed(format!("{page_size}-byte wasm pages")));
        }
        let memory_bytes = memory_pages
            .checked_mul(page_size)
            .filter(|&n| n <= MAX_MEMORY)
            .ok_or_else(|| malformed(format!("a memory of {memory_pages} pages")))?;
        let pages = memory_bytes.div_ceil(PAGE as u64);
        let clock_ns = body.u64()?;
        let mut meta = BTreeMap::new();
        for _ in 0..body.u32()? {
            let k = body.str(MAX_META)?;
            let v = body.str(MAX_META)?;
            if meta.insert(k, v).is_some() {
                return Err(malformed("a metadata key twice"));
            }
        }
        let n = body.u32()?;
        let mut globals = Vec::with_capacity(n.min(1 << 10) as usize);
        for _ in 0..n {
            let index = body.u32()?;
            if globals.last().is_some_and(|&(last, _)| last >= index) {
                return Err(malformed("globals out of order"));
            }
            let value = match body.u8()? {
                0 => GlobalValue::I32(i32::from_le_bytes(body.array()?)),
                1 => GlobalValue::I64(i64::from_le_bytes(body.array()?)),
                2 => GlobalValue::F32(u32::from_le_bytes(body.array()?)),
                3 => GlobalValue::F64(u64::from_le_bytes(body.array()?)),
                4 => GlobalValue::V128(u128::from_le_bytes(body.array()?)),
                tag => return Err(malformed(format!("global type {tag}"))),
            };
            globals.push((index, value));
        }
        let zeros = body.runs(pages)?;
        let runs = body.runs(pages)?;
        let total: u64 = runs
            .iter()
            .map(|r| byte_range(r, memory_bytes).len() as u64)
            .sum();
        let data = body.vec(total)?;
        if body.0.read(&mut [0]).map_err(body_error)? != 0 {
            return Err(malformed("bytes after the body"));
        }
        Ok(Self {
            page_size,
            memory_pages,
            runs,
            data,
            zeros,
            globals,
            clock_ns,
            meta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::fixture::{Guest, P, image, setups};
    use crate::engine::state::pages::Scan;

    fn key() -> StateKey {
        StateKey::new("0123abcd", "python")
    }

    /// A state with everything set: data runs, zero runs, globals, clock, metadata.
    fn sample() -> InstanceState {
        let (_, module) = setups(image()).remove(0);
        let mut a = Guest::new(&module);
        a.call::<_, i32>("grow", 1);
        for page in [0, 3, 4, 5, 30, 70] {
            a.store(page * P + 100, page + 1);
        }
        a.store(4096, 0);
        a.call::<_, ()>("set", (-1, i64::MIN, f64::NAN));
        let mut state = a.capture(Scan::Pagemap).unwrap();
        state.clock_ns = 123_456_789;
        state.meta.insert("cwd".into(), "/workspace".into());
        state.meta.insert("turns".into(), "3".into());
        assert_eq!(state.runs, [0..1, 3..6, 30..31, 70..71]);
        assert!(state.zeros.contains(&(1..2)));
        state
    }

    #[test]
    fn encode_decode_round_trip() {
        let state = sample();
        let bytes = state.encode(&key());
        assert_eq!(&bytes[..8], MAGIC);
        assert!(
            bytes.len() < state.saved_bytes() / 4,
            "compressed: {}",
            bytes.len()
        );
        let back = InstanceState::decode(&bytes, &key()).unwrap();
        assert_eq!(back, state);

        let (_, module) = setups(image()).remove(1);
        let mut b = Guest::new(&module);
        b.restore(&back).unwrap();
        assert_eq!(
            (b.load(100), b.load(4 * P + 100), b.load(70 * P + 100)),
            (1, 5, 71)
        );
        assert_eq!(b.load(4096), 0);
        assert!(b.call::<_, f64>("f", ()).is_nan());
        assert_eq!(b.call::<_, i64>("h", ()), i64::MIN);
    }

    #[test]
    fn a_flipped_byte_is_a_checksum_error() {
        let bytes = sample().encode(&key());
        for at in 12..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            match InstanceState::decode(&bad, &key()) {
                Err(StateError::Corrupted) => {}
                other => panic!("byte {at} of {}: {other:?}", bytes.len()),
            }
        }
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(matches!(
            InstanceState::decode(&bad, &key()),
            Err(StateError::NotAState)
        ));
        let mut bad = bytes;
        bad[8] = 2;
        let err = InstanceState::decode(&bad, &key()).unwrap_err();
        assert!(matches!(err, StateError::Version { found: 2 }), "{err}");
    }

    #[test]
    fn a_state_from_another_image_says_so() {
        let bytes = sample().encode(&key());
        let others = [
            StateKey::new("0123abce", "python"),
            StateKey::new("0123abcd", "javascript"),
            StateKey {
                wasmtime: "47.0.0".into(),
                ..key()
            },
        ];
        for other in others {
            let err = InstanceState::decode(&bytes, &other).unwrap_err();
            assert!(matches!(err, StateError::OtherImage { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains("the state is from another image"), "{msg}");
            assert!(msg.contains("0123abcd"), "{msg}");
        }
    }

    #[test]
    fn truncated_and_foreign_files_are_errors_not_panics() {
        let bytes = sample().encode(&key());
        for n in 0..bytes.len() {
            let err = InstanceState::decode(&bytes[..n], &key()).unwrap_err();
            assert!(
                matches!(err, StateError::NotAState | StateError::Corrupted),
                "{n}: {err:?}"
            );
        }
        for junk in [&b""[..], b"WBXSTATE", b"\0asm\x01\0\0\0", &[0xff; 100]] {
            assert!(InstanceState::decode(junk, &key()).is_err());
        }
    }

    /// A file around `body` (compressed when `zstd`) with a correct checksum.
    fn frame(body: &[u8], zstd: bool) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        let mut h = Out(&mut out);
        h.u32(FORMAT_VERSION);
        h.str(&key().image);
        h.str(&key().wasmtime);
        h.str(&key().language);
        if zstd {
            out.extend(zstd::stream::encode_all(body, 1).unwrap());
        } else {
            out.extend_from_slice(body);
        }
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    /// A body: 64 KiB pages, `pages` of them, no clock, metadata or globals, then `rest`.
    fn body(pages: u64, rest: impl FnOnce(&mut Out<&mut Vec<u8>>)) -> Vec<u8> {
        let mut b = Vec::new();
        let mut o = Out(&mut b);
        o.u64(65536);
        o.u64(pages);
        o.u64(0);
        o.u32(0);
        o.u32(0);
        rest(&mut o);
        b
    }

    /// A body of 4 wasm pages, no zero pages, `runs` of saved pages and no bytes for them.
    fn saved_runs(runs: &[Range<u64>]) -> Vec<u8> {
        body(4, |o| {
            o.runs(&[]);
            o.runs(runs);
        })
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let mut good = Vec::new();
        sample().write_body(&mut good);
        assert!(InstanceState::decode(&frame(&good, true), &key()).is_ok());

        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            ("not zstd", good.clone(), false),
            ("empty", vec![], true),
            ("cut short", good[..good.len() - 1].to_vec(), true),
            ("trailing bytes", [&good[..], &[0]].concat(), true),
            ("pages past 4 GiB", body(65537, |o| o.runs(&[])), true),
            (
                "odd page size",
                {
                    let mut b = body(1, |o| o.runs(&[]));
                    b[..8].copy_from_slice(&3u64.to_le_bytes());
                    b
                },
                true,
            ),
            (
                "a run past the memory",
                saved_runs(&[Range { start: 60, end: 65 }]),
                true,
            ),
            ("runs out of order", saved_runs(&[3..4, 1..2]), true),
            (
                "an empty run",
                saved_runs(&[Range { start: 3, end: 3 }]),
                true,
            ),
            // 4 GiB of pages claimed, a few bytes there: refused without allocating them.
            (
                "pages missing",
                body(65536, |o| {
                    o.runs(&[]);
                    o.runs(&[Range {
                        start: 0,
                        end: 1 << 20,
                    }]);
                    o.bytes(&[1; 4096]);
                }),
                true,
            ),
            (
                "an unknown global type",
                {
                    let mut b = body(1, |_| {});
                    b.truncate(b.len() - 4);
                    let mut o = Out(&mut b);
                    o.u32(1);
                    o.u32(0);
                    o.bytes(&[9]);
                    b
                },
                true,
            ),
        ];
        for (what, body, zstd) in cases {
            match InstanceState::decode(&frame(&body, zstd), &key()) {
                Err(StateError::Malformed(_)) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }
}
