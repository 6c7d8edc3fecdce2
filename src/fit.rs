//! Guest text measured and cut as it travels: inside JSON strings. A tool answer's budget
//! (`WASMBOX_RESULT_BYTES`) is bytes of JSON text, where a newline takes 2 bytes and another
//! control character 6, so a flood of `\x01` cannot pass for a sixth of its size.

use std::ops::Range;

use serde_json::Value;

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
    json_fit(s, budget, false).0
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

/// How many characters of guest text a note may quote.
pub const QUOTE_CHARS: usize = 200;

/// Guest text as a note quotes it: at most `max` characters (then `…`), line breaks and tabs
/// as spaces and other control characters as U+FFFD, so a quoted name cannot be a flood nor
/// forge lines of the answer.
pub fn quote(s: &str, max: usize) -> String {
    let mut chars = s.chars();
    let mut out: String = chars
        .by_ref()
        .take(max)
        .map(|c| match c {
            '\n' | '\r' | '\t' => ' ',
            c if c.is_control() => '\u{fffd}',
            c => c,
        })
        .collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// The end of guest text (where a traceback says what went wrong) as a note quotes it, as
/// [`quote`] does its start.
pub fn quote_tail(s: &str, max: usize) -> String {
    match s.char_indices().rev().nth(max) {
        Some((i, c)) => format!("…{}", quote(&s[i + c.len_utf8()..], max)),
        None => quote(s, max),
    }
}

/// Strings taking at most this many bytes of JSON are never cut by [`fit_value`]: a marker
/// alone takes up to 60.
const MIN_CUT: usize = 120;

/// Bytes `v` takes as 2-space-indented JSON text (a tool answer's text block), counted without
/// building the text.
pub fn pretty_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    let _ = serde_json::to_writer_pretty(&mut n, v);
    n.0
}

/// Fits `v`'s 2-space-indented text (and so its compact text) to `budget` bytes whatever its
/// fields hold: the longest strings are cut in the middle (start and end kept, a marker
/// between) to one common length, as long as that keeps [`MIN_CUT`] bytes each; if short
/// strings alone still overflow, the longest lists lose entries from their end. No field is
/// removed, so `v` keeps its schema. What stays over the budget is only the fixed frame (keys,
/// numbers, a string of at most `MIN_CUT` bytes per field). Returns whether anything was cut.
pub fn fit_value(v: &mut Value, budget: usize) -> bool {
    let mut cut = false;
    loop {
        let len = pretty_len(v);
        if len <= budget {
            return cut;
        }
        if !cut_strings(v, len - budget) && !shorten_a_list(v, len - budget) {
            return cut;
        }
        cut = true;
    }
}

/// Cuts the longest strings of `v` to the one length that saves `excess` bytes of JSON (but
/// never below [`MIN_CUT`]). Returns whether any was cut.
fn cut_strings(v: &mut Value, excess: usize) -> bool {
    fn strings<'a>(v: &'a mut Value, out: &mut Vec<&'a mut String>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter_mut().for_each(|x| strings(x, out)),
            Value::Object(m) => m.values_mut().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    strings(v, &mut all);
    let mut lens: Vec<usize> = all.iter().map(|s| json_len(s)).collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    // Cutting the k longest to `level` saves (their sum) - k * level: the highest level that
    // saves `excess` while cutting no string shorter than it.
    let mut level = 0;
    let mut sum = 0;
    for (i, &n) in lens.iter().enumerate() {
        sum += n;
        let next = lens.get(i + 1).copied().unwrap_or(0);
        if sum >= excess + (i + 1) * next {
            level = (sum - excess) / (i + 1);
            break;
        }
    }
    let level = level.max(MIN_CUT);
    let mut cut = false;
    for s in all {
        if let Some((text, _)) = elide_middle(s, None, level) {
            *s = text;
            cut = true;
        }
    }
    cut
}

/// Drops entries from the end of `v`'s largest non-empty list until about `excess` bytes
/// are saved. Returns whether any was dropped.
fn shorten_a_list(v: &mut Value, excess: usize) -> bool {
    fn largest<'a>(v: &'a mut Value, best: &mut Option<(usize, &'a mut Vec<Value>)>) {
        match v {
            Value::Array(a) => {
                let n = 2 + a.iter().map(pretty_len).sum::<usize>();
                // Lists inside this one are smaller than it.
                if !a.is_empty() && best.as_ref().is_none_or(|(m, _)| n > *m) {
                    *best = Some((n, a));
                } else {
                    a.iter_mut().for_each(|x| largest(x, best));
                }
            }
            Value::Object(m) => m.values_mut().for_each(|x| largest(x, best)),
            _ => {}
        }
    }
    let mut best = None;
    largest(v, &mut best);
    let Some((_, list)) = best else {
        return false;
    };
    let mut saved = 0;
    while saved < excess {
        match list.pop() {
            Some(e) => saved += pretty_len(&e) + 2,
            None => break,
        }
    }
    true
}

/// The text at the start of `buf` whose JSON string form fits `budget` bytes: (bytes skipped
/// at the start, the text, whether bytes are left after it). Counting JSON keeps a file of
/// control characters (a sparse file is all NULs, six bytes each as `\u0000`) within the
/// budget. The text ends at a character boundary; unless `at_boundary`, up to three
/// continuation bytes at the start are skipped (an offset inside a character starts at the
/// next one). Unless `at_end`, a character cut at the end of `buf` is left for the next
/// window. `None` when the bytes before the cut are not UTF-8.
pub fn text_window(
    buf: &[u8],
    at_boundary: bool,
    at_end: bool,
    budget: usize,
) -> Option<(usize, &str, bool)> {
    let skip = if at_boundary {
        0
    } else {
        buf.iter().take(3).take_while(|b| *b & 0xC0 == 0x80).count()
    };
    let rest = &buf[skip..];
    let (valid, bad) = match std::str::from_utf8(rest) {
        Ok(s) => (s, false),
        Err(e) => (
            std::str::from_utf8(&rest[..e.valid_up_to()]).ok()?,
            e.error_len().is_some() || at_end,
        ),
    };
    let (text, used) = json_fit(valid, budget, true);
    // Bad bytes the window would have reached (a byte takes at least one).
    if bad && text.len() == valid.len() && used < budget {
        return None;
    }
    Some((skip, text, text.len() < rest.len()))
}

/// The longest start of `s` whose JSON string form fits `budget` bytes, but at least one
/// character, so a reader paging through a file always moves on.
pub fn json_prefix(s: &str, budget: usize) -> &str {
    json_fit(s, budget, true).0
}

/// The longest start of `s` within `budget` JSON bytes (at least one character with
/// `at_least_one`), and the bytes it takes.
fn json_fit(s: &str, budget: usize, at_least_one: bool) -> (&str, usize) {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        let n = json_char_len(c);
        if used + n > budget && (i > 0 || !at_least_one) {
            return (&s[..i], used);
        }
        used += n;
    }
    (s, used)
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
    fn quotes_are_short_and_plain() {
        assert_eq!(quote("numpyy", 200), "numpyy");
        assert_eq!(quote("a\u{1}b\nc", 200), "a\u{fffd}b c");
        let q = quote(&"\u{1}".repeat(900_000), 200);
        assert_eq!(q.chars().count(), 201);
        assert!(q.ends_with('…'));
        assert_eq!(quote_tail("abcdef", 3), "…def");
        assert_eq!(quote_tail("abc", 3), "abc");
    }

    /// A small deterministic PRNG (xorshift).
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn any_value_fits_and_keeps_its_fields() {
        let mut x = 0x31u64;
        let pieces = ["\u{1}", "x", "é", "\n", "\"", "😀"];
        for round in 0..200 {
            let s = |x: &mut u64| {
                let n = (next(x) % 200_000) as usize >> (next(x) % 12);
                pieces[(next(x) % 6) as usize].repeat(n)
            };
            let notes: Vec<Value> = (0..next(&mut x) % 50).map(|_| s(&mut x).into()).collect();
            let mut v = serde_json::json!({
                "stdout": s(&mut x), "stderr": s(&mut x), "exit_code": 1,
                "notes": notes, "nested": {"data": {"text/html": s(&mut x)}},
                "many": vec!["short"; (next(&mut x) % 5000) as usize],
            });
            let keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            let budget = [300, 2_000, 8_000, 80_000][round % 4];
            let before = pretty_len(&v);
            let cut = fit_value(&mut v, budget);
            let after = pretty_len(&v);
            assert_eq!(after, serde_json::to_string_pretty(&v).unwrap().len());
            assert!(
                cut || before <= budget || after > budget - 600,
                "{before} {budget}"
            );
            assert!(!cut || before > budget);
            // Past a tiny budget, the frame itself (10 fields) is what may not fit.
            assert!(
                after <= budget.max(1_500),
                "{after} > {budget} (round {round})"
            );
            let now: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            assert_eq!(keys, now);
            assert!(v["stdout"].is_string() && v["nested"]["data"]["text/html"].is_string());
        }
    }

    #[test]
    fn long_strings_share_the_room() {
        let mut v =
            serde_json::json!({"a": "a".repeat(1_000_000), "b": "b".repeat(1_000_000), "c": "c"});
        assert!(fit_value(&mut v, 10_000));
        let (a, b) = (v["a"].as_str().unwrap(), v["b"].as_str().unwrap());
        assert!(a.len().abs_diff(b.len()) < 100, "{} {}", a.len(), b.len());
        assert!(a.len() > 4_000 && a.starts_with('a') && a.ends_with('a'));
        assert!(a.contains("bytes elided]"));
        assert_eq!(v["c"], "c");
        assert!(!fit_value(&mut v, 10_000));
    }

    #[test]
    fn sharing_gives_each_what_it_needs_or_half() {
        assert_eq!(share(10, 20, 100), (10, 20));
        assert_eq!(share(1000, 20, 100), (80, 20));
        assert_eq!(share(20, 1000, 100), (20, 80));
        assert_eq!(share(1000, 1000, 100), (50, 50));
    }

    #[test]
    fn text_windows_end_at_characters_and_count_json() {
        let s = "aé€😀".as_bytes();
        assert_eq!(text_window(s, true, true, 8), Some((0, "aé€", true)));
        assert_eq!(text_window(s, true, true, 10), Some((0, "aé€😀", false)));
        // Inside a character: from the next one.
        assert_eq!(
            text_window(&s[2..], false, true, 100),
            Some((1, "€😀", false))
        );
        // At least one character, so paging moves on.
        assert_eq!(text_window(&s[6..], true, true, 1), Some((0, "😀", false)));
        // A character cut by the read is left for the next window; at the end it is not text.
        assert_eq!(
            text_window(&s[..8], true, false, 100),
            Some((0, "aé€", true))
        );
        assert_eq!(text_window(&s[..8], true, true, 100), None);
        // Bytes that are not UTF-8: refused when reached, fine when the window ends before.
        assert_eq!(text_window(b"abc\xff", true, true, 100), None);
        assert_eq!(
            text_window(b"abc\xff", true, true, 3),
            Some((0, "abc", true))
        );
        assert_eq!(text_window(b"\x80abc", true, true, 100), None);
        assert_eq!(text_window(b"\x80\x80\x80\x80a", false, true, 100), None);
        // JSON escapes count: 2 for a newline or quote, 6 for other control characters.
        assert_eq!(json_prefix("\n\n\n", 5), "\n\n");
        assert_eq!(json_prefix("\"\\x", 4), "\"\\");
        assert_eq!(json_prefix("\0\0", 11), "\0");
        assert_eq!(json_prefix("\u{7f}é", 3), "\u{7f}é");
    }
}
