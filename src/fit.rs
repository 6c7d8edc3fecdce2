//! Guest text measured and cut as it travels: inside JSON strings. A tool answer's budget
//! (`WASMBOX_RESULT_BYTES`) is bytes of JSON text, where a newline takes 2 bytes and another
//! control character 6, so a flood of `\x01` cannot pass for a sixth of its size.

use std::ops::Range;

/// Bytes `c` takes inside a JSON string as serde_json writes it.
pub fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if c < ' ' => 6,
        c => c.len_utf8(),
    }
}

/// Bytes `s` takes inside a JSON string (without the quotes).
pub fn json_len(s: &str) -> usize {
    s.chars().map(json_char_len).sum()
}

/// Where a stream's middle was already dropped (at the output cap): the marker's byte range in
/// the text, and how many bytes of output it stands for. A later cut that spans it adds them up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    pub at: Range<usize>,
    pub bytes: u64,
}

/// The line that stands in a stream for `bytes` of its output left out.
pub fn marker(bytes: u64) -> String {
    format!("\n… [wasmbox: {} bytes elided] …\n", thousands(bytes))
}

/// `4812345` as `4,812,345`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// The longest start of `s` that takes at most `budget` bytes as JSON.
fn prefix_within(s: &str, budget: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        used += json_char_len(c);
        if used > budget {
            return &s[..i];
        }
    }
    s
}

/// The longest end of `s` that takes at most `budget` bytes as JSON.
fn suffix_within(s: &str, budget: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices().rev() {
        used += json_char_len(c);
        if used > budget {
            return &s[i + c.len_utf8()..];
        }
    }
    s
}

/// `s` cut in the middle to take at most `budget` bytes as JSON, marker included: the start and
/// the end are kept (the end of a stream is where a traceback or a final result is), half the
/// room each unless one side is shorter. A `gap` (an earlier cut's marker) is always within
/// what is dropped, and its bytes are counted in the new marker. Returns the text and the
/// bytes of output it leaves out; `None` when `s` fits as it is.
pub fn elide_middle(s: &str, gap: Option<&Gap>, budget: usize) -> Option<(String, u64)> {
    if json_len(s) <= budget {
        return None;
    }
    let gap = gap.filter(|g| s.get(g.at.clone()).is_some());
    let (before, after, prior) = match gap {
        Some(g) => (&s[..g.at.start], &s[g.at.end..], g.bytes),
        None => {
            let mut mid = s.len() / 2;
            while !s.is_char_boundary(mid) {
                mid -= 1;
            }
            (&s[..mid], &s[mid..], 0)
        }
    };
    // The marker at its widest: every byte of the text and of the earlier gap left out.
    let keep = budget.saturating_sub(json_len(&marker(prior + s.len() as u64)));
    let mut head = prefix_within(before, keep / 2);
    let tail = suffix_within(after, keep - json_len(head));
    if tail.len() == after.len() {
        head = prefix_within(before, keep - json_len(tail));
    }
    let elided = prior + (before.len() - head.len() + after.len() - tail.len()) as u64;
    Some(([head, &marker(elided), tail].concat(), elided))
}

/// How `room` bytes of JSON are shared by two streams needing `a` and `b`: each gets what it
/// needs when that is at most half; otherwise the other's leftover, and at least half.
pub fn share(a: usize, b: usize, room: usize) -> (usize, usize) {
    let b_share = b.min((room / 2).max(room.saturating_sub(a)));
    let a_share = a.min(room - b_share);
    (a_share, b_share)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_len_matches_serde_json() {
        for s in ["\"\\\n\t\u{7f}é\u{0}x\u{1}\u{1f}", "plain", "", "€𝄞"] {
            assert_eq!(
                json_len(s) + 2,
                serde_json::to_string(s).unwrap().len(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(4_812_345), "4,812,345");
    }

    #[test]
    fn a_middle_cut_keeps_both_ends_within_budget() {
        let s: String = (0..10_000).map(|i| format!("line {i}\n")).collect();
        let (cut, elided) = elide_middle(&s, None, 1000).unwrap();
        assert!(json_len(&cut) <= 1000, "{}", json_len(&cut));
        assert!(cut.starts_with("line 0\nline 1\n"), "{cut}");
        assert!(cut.ends_with("line 9999\n"), "{cut}");
        let m = marker(elided);
        assert!(cut.contains(&m), "{cut}");
        assert_eq!(cut.len() - m.len() + elided as usize, s.len());
        assert_eq!(elide_middle("short", None, 1000), None);
    }

    #[test]
    fn cuts_land_on_char_boundaries_and_count_escapes() {
        let s = "é\u{1}".repeat(5000);
        for budget in [0, 1, 7, 100, 1001] {
            let (cut, _) = elide_middle(&s, None, budget).unwrap();
            // Slicing a str off a boundary would have panicked; the marker alone may overflow
            // a budget smaller than itself.
            assert!(
                json_len(&cut) <= budget.max(json_len(&marker(0)) + 8),
                "{budget}"
            );
        }
        let (cut, _) = elide_middle(&"\u{1}".repeat(1_000_000), None, 600).unwrap();
        assert!(serde_json::to_string(&cut).unwrap().len() <= 602);
    }

    #[test]
    fn an_earlier_gap_is_dropped_and_counted() {
        let m = marker(1_000);
        let s = format!("{}{m}{}", "a".repeat(500), "b".repeat(500));
        let gap = Gap {
            at: 500..500 + m.len(),
            bytes: 1_000,
        };
        let (cut, elided) = elide_middle(&s, Some(&gap), 200).unwrap();
        assert!(cut.starts_with('a') && cut.ends_with('b'), "{cut}");
        assert_eq!(
            elided,
            1_000 + 1_000 - (cut.len() - marker(elided).len()) as u64
        );
        assert_eq!(cut.matches("elided").count(), 1, "{cut}");
        // A short side gives its room to the other.
        let s = format!("x{m}{}", "b".repeat(5000));
        let gap = Gap {
            at: 1..1 + m.len(),
            bytes: 7,
        };
        let (cut, _) = elide_middle(&s, Some(&gap), 300).unwrap();
        assert!(cut.starts_with("x\n…"), "{cut}");
        assert!(json_len(&cut) > 250, "{}", json_len(&cut));
    }

    #[test]
    fn sharing_gives_each_what_it_needs_or_half() {
        assert_eq!(share(10, 20, 100), (10, 20));
        assert_eq!(share(1000, 20, 100), (80, 20));
        assert_eq!(share(20, 1000, 100), (20, 80));
        assert_eq!(share(1000, 1000, 100), (50, 50));
    }
}
