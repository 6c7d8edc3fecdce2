//! Wheels as the host handles them: names read from the file name, only pure-Python tags taken,
//! every member checked against the wheel's own `RECORD`, and the unpacking done through a
//! capability-scoped directory, bounded in bytes and entries, whatever the archive claims.

use std::collections::HashMap;
use std::io::{Read, Seek, Write};
use std::path::Path;

use base64::Engine as _;

use crate::bounded::{Overrun, copy_member};
use cap_std::fs::Dir;
use sha2::{Digest, Sha256};

use super::PackageError;

/// What one wheel may unpack to.
const MAX_UNPACKED: u64 = 512 << 20;
const MAX_MEMBERS: usize = 20_000;

/// A wheel's file name, parsed (PEP 427: `{dist}-{version}(-{build})?-{py}-{abi}-{platform}.whl`).
#[derive(Clone, Debug, PartialEq)]
pub struct WheelName {
    pub dist: String,
    pub version: String,
    pub python: String,
    pub abi: String,
    pub platform: String,
}

impl WheelName {
    pub fn parse(file: &str) -> Option<Self> {
        let stem = file.strip_suffix(".whl")?;
        let parts: Vec<&str> = stem.split('-').collect();
        let (dist, version, tags) = match parts.len() {
            5 => (parts[0], parts[1], &parts[2..]),
            6 => (parts[0], parts[1], &parts[3..]),
            _ => return None,
        };
        Some(Self {
            dist: dist.to_string(),
            version: version.to_string(),
            python: tags[0].to_string(),
            abi: tags[1].to_string(),
            platform: tags[2].to_string(),
        })
    }

    /// Runs on any Python 3 without compiled code: `py3-none-any` or `py2.py3-none-any`.
    pub fn is_pure(&self) -> bool {
        self.abi == "none"
            && self.platform == "any"
            && self.python.split('.').any(|t| t == "py3" || t == "py30")
    }
}

/// Distribution names compared as PEP 503 says: case-folded, runs of `-_.` as one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// What a wheel says of itself in `*.dist-info/METADATA`.
#[derive(Debug)]
pub struct Metadata {
    pub name: String,
    pub version: String,
    pub requires: Vec<String>,
}

fn bad(wheel: &str, why: impl std::fmt::Display) -> PackageError {
    PackageError::BadWheel {
        wheel: wheel.to_string(),
        why: why.to_string(),
    }
}

/// The `sha256=` form RECORD uses: URL-safe base64 without padding.
fn record_form(digest: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
}

/// The buffer a member streams through: a member never decides how much the host holds.
const CHUNK: usize = 256 << 10;

/// RECORD and METADATA, the members read whole (to be parsed), are taken up to this size.
const MAX_PARSED: u64 = 16 << 20;

fn mib(n: u64) -> String {
    format!("{} MiB", n.div_ceil(1 << 20))
}

/// Unpacks the wheel `file` (named `wheel`) into `dir` (empty, the caller's temporary tree),
/// member by member through one bounded buffer: members under `*.data/purelib` or
/// `*.data/platlib` go to the root as installers put them, other `.data` parts (scripts,
/// headers) are left out. Every member must be listed in RECORD with its hash, checked as it
/// streams; a name that would climb out, an absolute one, or a link is refused (cap-std refuses
/// them too); a member that declares more than the room left, or inflates past what it
/// declares, is refused before it fills memory or disk. Returns the wheel's metadata.
pub fn unpack<R: Read + Seek>(wheel: &str, file: R, dir: &Dir) -> Result<Metadata, PackageError> {
    let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(wheel, e))?;
    if zip.len() > MAX_MEMBERS {
        return Err(bad(
            wheel,
            format!("{} members, more than {MAX_MEMBERS}", zip.len()),
        ));
    }
    let dist_info = (0..zip.len())
        .filter_map(|i| zip.name_for_index(i)?.ok().map(|n| n.into_owned()))
        .find_map(|n| {
            let (top, rest) = n.split_once('/')?;
            (top.ends_with(".dist-info") && rest == "RECORD").then(|| top.to_string())
        })
        .ok_or_else(|| bad(wheel, "no *.dist-info/RECORD"))?;
    let record = read_member(&mut zip, &format!("{dist_info}/RECORD"), wheel)?;
    let record = String::from_utf8(record).map_err(|_| bad(wheel, "RECORD is not UTF-8"))?;
    let mut hashes: HashMap<&str, &str> = HashMap::new();
    for line in record.lines().filter(|l| !l.is_empty()) {
        // RECORD is CSV; wheel paths with commas are quoted, which nothing we take needs.
        let mut cols = line.rsplitn(3, ',');
        let (_size, hash, path) = (cols.next(), cols.next(), cols.next());
        if let (Some(hash), Some(path)) = (hash, path) {
            hashes.insert(path.trim_matches('"'), hash);
        }
    }
    let data = dist_info.trim_end_matches(".dist-info").to_string() + ".data/";
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).map_err(|e| bad(wheel, e))?;
        let name = member.name().map_err(|e| bad(wheel, e))?.into_owned();
        if member.is_dir() {
            continue;
        }
        if member.is_symlink() {
            return Err(bad(wheel, format!("{name} is a link")));
        }
        let unsafe_name = name.starts_with('/')
            || name.contains('\\')
            || name.contains('\0')
            || name.split('/').any(|c| c == ".." || c.is_empty());
        if unsafe_name || member.enclosed_name().is_none() {
            return Err(bad(wheel, format!("member {name:?} would land outside")));
        }
        let unsigned = name == format!("{dist_info}/RECORD")
            || name == format!("{dist_info}/RECORD.jws")
            || name == format!("{dist_info}/RECORD.p7s");
        let want = match hashes.get(name.as_str()) {
            Some(h) => h.strip_prefix("sha256="),
            None if unsigned => None,
            None => return Err(bad(wheel, format!("{name} is not in RECORD"))),
        };
        if want.is_none() && !unsigned {
            return Err(bad(wheel, format!("RECORD gives {name} no sha256")));
        }
        let room = MAX_UNPACKED - total;
        let declared = member.size();
        if declared > room {
            return Err(bad(
                wheel,
                format!(
                    "{name} declares {}: it unpacks to more than {}",
                    mib(declared),
                    mib(MAX_UNPACKED)
                ),
            ));
        }
        let target = match name.strip_prefix(&data) {
            Some(rest) => rest
                .strip_prefix("purelib/")
                .or_else(|| rest.strip_prefix("platlib/"))
                .filter(|inner| !inner.is_empty())
                .map(str::to_string),
            None => Some(name.clone()),
        };
        // Left-out members are still read through: their hashes are checked all the same.
        let mut out: Box<dyn Write> = match &target {
            Some(target) => {
                let path = Path::new(target);
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    dir.create_dir_all(parent).map_err(|e| bad(wheel, e))?;
                }
                Box::new(dir.create(path).map_err(|e| bad(wheel, e))?)
            }
            None => Box::new(std::io::sink()),
        };
        let mut h = Sha256::new();
        let n = copy_member(
            &mut member,
            declared,
            room,
            &mut out,
            Some(&mut h),
            &mut buf,
        )
        .map_err(|e| stopped(wheel, &name, declared, MAX_UNPACKED, e))?;
        total += n;
        let got = record_form(&h.finalize());
        if let Some(want) = want
            && got != want
        {
            return Err(PackageError::Hash {
                what: format!("{wheel}: {name}"),
                expected: want.to_string(),
                got,
            });
        }
    }
    let meta = read_member(&mut zip, &format!("{dist_info}/METADATA"), wheel)?;
    parse_metadata(&String::from_utf8_lossy(&meta))
        .ok_or_else(|| bad(wheel, "METADATA has no Name or Version"))
}

/// A member read whole to be parsed, refused past [`MAX_PARSED`].
fn read_member<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    name: &str,
    wheel: &str,
) -> Result<Vec<u8>, PackageError> {
    let mut member = zip
        .by_name(name)
        .map_err(|_| bad(wheel, format!("no {name}")))?;
    let declared = member.size();
    if declared > MAX_PARSED {
        return Err(bad(
            wheel,
            format!(
                "{name} declares {}, more than {}",
                mib(declared),
                mib(MAX_PARSED)
            ),
        ));
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 8 << 10];
    copy_member(&mut member, declared, MAX_PARSED, &mut out, None, &mut buf)
        .map_err(|e| stopped(wheel, name, declared, MAX_PARSED, e))?;
    Ok(out)
}

/// The refusal of member `name`, whose copy stopped at `e`.
fn stopped(wheel: &str, name: &str, declared: u64, cap: u64, e: Overrun) -> PackageError {
    bad(
        wheel,
        match e {
            Overrun::Declared => format!("{name} inflates past its declared {declared} bytes"),
            Overrun::Cap => format!("{name}: it unpacks to more than {}", mib(cap)),
            Overrun::Io(e) => format!("{name}, declared as {declared} bytes: {e}"),
        },
    )
}

/// The headers of METADATA (an email-style header block) that resolution needs.
pub fn parse_metadata(text: &str) -> Option<Metadata> {
    let (mut name, mut version, mut requires) = (None, None, Vec::new());
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let v = v.trim().to_string();
            match k.to_ascii_lowercase().as_str() {
                "name" => name = Some(v),
                "version" => version = Some(v),
                "requires-dist" => requires.push(v),
                _ => {}
            }
        }
    }
    Some(Metadata {
        name: name?,
        version: version?,
        requires,
    })
}

/// The distributions a zip of site-packages holds (its top-level `*.dist-info` folders), as
/// normalised name and version: what the runtime bundles.
pub fn dist_infos(zip_path: &Path) -> std::io::Result<Vec<(String, String)>> {
    let zip =
        zip::ZipArchive::new(std::fs::File::open(zip_path)?).map_err(std::io::Error::other)?;
    let mut out: Vec<(String, String)> = zip
        .file_names()
        .filter_map(|n| {
            let n = n.ok()?;
            let top = n.split('/').next()?;
            let stem = top.strip_suffix(".dist-info")?;
            let (name, version) = stem.rsplit_once('-')?;
            Some((normalize(name), version.to_string()))
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    #[test]
    fn names_and_tags() {
        let w = WheelName::parse("python_slugify-8.0.4-py2.py3-none-any.whl").unwrap();
        assert_eq!(
            (w.dist.as_str(), w.version.as_str()),
            ("python_slugify", "8.0.4")
        );
        assert!(w.is_pure());
        let c = WheelName::parse("numpy-2.0-1-cp312-cp312-manylinux_2_17_x86_64.whl").unwrap();
        assert!(!c.is_pure());
        assert!(!WheelName::parse("x-1-py2-none-any.whl").unwrap().is_pure());
        assert_eq!(WheelName::parse("bad.whl"), None);
        assert_eq!(normalize("Python_Slugify..x"), "python-slugify-x");
    }

    fn zip_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (n, b) in members {
            w.start_file(*n, opts).unwrap();
            w.write_all(b).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    fn record(members: &[(&str, &[u8])]) -> String {
        let mut r = String::new();
        for (n, b) in members {
            r += &format!(
                "{n},sha256={},{}\n",
                record_form(&Sha256::digest(b)),
                b.len()
            );
        }
        r + "p-1.dist-info/RECORD,,\n"
    }

    #[test]
    fn unpacks_checked_members_only() {
        let files: [(&str, &[u8]); 2] = [
            ("p/__init__.py", b"X = 1\n"),
            (
                "p-1.dist-info/METADATA",
                b"Name: p\nVersion: 1\nRequires-Dist: q>=2\n\nbody",
            ),
        ];
        let rec = record(&files);
        let mut all = files.to_vec();
        all.push(("p-1.dist-info/RECORD", rec.as_bytes()));
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open_ambient_dir(t.path(), cap_std::ambient_authority()).unwrap();
        let m = unpack("p-1-py3-none-any.whl", Cursor::new(zip_of(&all)), &dir).unwrap();
        assert_eq!(
            (m.name.as_str(), m.requires.as_slice()),
            ("p", &["q>=2".to_string()][..])
        );
        assert_eq!(
            std::fs::read(t.path().join("p/__init__.py")).unwrap(),
            b"X = 1\n"
        );

        // One byte changed after RECORD was written: refused, nothing trusted.
        let mut tampered = all.clone();
        tampered[0] = ("p/__init__.py", b"X = 2\n");
        let t2 = tempfile::tempdir().unwrap();
        let dir2 = Dir::open_ambient_dir(t2.path(), cap_std::ambient_authority()).unwrap();
        let e = unpack(
            "p-1-py3-none-any.whl",
            Cursor::new(zip_of(&tampered)),
            &dir2,
        )
        .unwrap_err();
        assert!(matches!(e, PackageError::Hash { .. }), "{e}");

        // A member that climbs out is refused before anything is written for it.
        let mut out = all.clone();
        out.push(("../evil.py", b""));
        let e = unpack("p-1-py3-none-any.whl", Cursor::new(zip_of(&out)), &dir2).unwrap_err();
        assert!(e.to_string().contains("outside"), "{e}");
        assert!(!t2.path().parent().unwrap().join("evil.py").exists());
    }

    /// Sets the uncompressed size `member` declares, in its local header and the central
    /// directory both (as a crafted archive would).
    fn declare(zip: &mut [u8], member: &str, size: u32) {
        for (sig, at_size, at_name) in [(b"PK\x03\x04", 22, 30), (b"PK\x01\x02", 24, 46)] {
            let mut hits = 0;
            for i in 0..zip.len() - at_name - member.len() {
                if &zip[i..i + 4] == sig && zip[i + at_name..].starts_with(member.as_bytes()) {
                    zip[i + at_size..i + at_size + 4].copy_from_slice(&size.to_le_bytes());
                    hits += 1;
                }
            }
            assert_eq!(hits, 1, "{member}");
        }
    }

    #[test]
    fn members_larger_than_declared_or_than_the_room_are_refused() {
        let big = vec![0u8; 1 << 20];
        let files: [(&str, &[u8]); 2] = [
            ("p/big.bin", &big),
            ("p-1.dist-info/METADATA", b"Name: p\nVersion: 1\n"),
        ];
        let rec = record(&files);
        let mut all = files.to_vec();
        all.push(("p-1.dist-info/RECORD", rec.as_bytes()));
        let mut lying = zip_of(&all);
        declare(&mut lying, "p/big.bin", 1000);
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open_ambient_dir(t.path(), cap_std::ambient_authority()).unwrap();
        let e = unpack("p-1-py3-none-any.whl", Cursor::new(lying), &dir)
            .unwrap_err()
            .to_string();
        assert!(e.contains("p/big.bin") && e.contains("declared"), "{e}");
        let written = std::fs::metadata(t.path().join("p/big.bin")).map_or(0, |m| m.len());
        assert!(written <= 1000, "{written} bytes written");

        let mut huge = zip_of(&all);
        declare(&mut huge, "p/big.bin", 600 << 20);
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open_ambient_dir(t.path(), cap_std::ambient_authority()).unwrap();
        let e = unpack("p-1-py3-none-any.whl", Cursor::new(huge), &dir)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("p/big.bin declares 600 MiB") && e.contains("more than 512 MiB"),
            "{e}"
        );
        assert!(!t.path().join("p/big.bin").exists());
    }
}
