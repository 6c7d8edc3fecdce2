//! Rich mode: after a session's turn, a final DataFrame is collected as HTML by a turn of its
//! own. The guest's code can replace `_wasmbox.rich` and print anything up to the turn's stdout
//! cap (which bounds the total bytes), so the host bounds the reply while it is parsed: the item
//! count, each item's type and size, and the notes are checked here, and past a few items the
//! rest are skipped unread rather than collected and then cut.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::turn::{call, turn};
use crate::lang::live::Session;
use crate::lang::{ExecRequest, Language, RichOutput};

/// Bounds of what rich mode's own turn returns (its images come from the turn before it, within
/// the request's image budget).
const RICH_MAX_HTML_BYTES: usize = 1 << 20;
/// Bounds of the notes a rich turn may add (the guest's hook writes them).
const RICH_MAX_NOTES: usize = 16;
const RICH_MAX_NOTE_BYTES: usize = 1 << 10;

/// Collects a final DataFrame (as HTML) of the last turn, the turn having returned its
/// figures itself. Returns it and notes on what was dropped.
pub(super) fn collect(s: &mut Session, req: &ExecRequest) -> (Vec<RichOutput>, Vec<String>) {
    let mut collect = req.clone();
    // JSON escapes a character in at most 12 bytes (a surrogate pair); room for the notes.
    collect.output_bytes = RICH_MAX_HTML_BYTES * 12 + (64 << 10);
    collect.images = None;
    s.guest.arm(&collect);
    let code = call(("rich", RICH_MAX_HTML_BYTES));
    let outcome = turn(&mut s.guest.store, &s.instance, &code);
    s.alive = matches!(outcome, Ok(0));
    let r = s.guest.result(outcome, Language::Python);
    let parsed = (r.exit_code == 0)
        .then(|| parse(&r.stdout))
        .and_then(|p| p.ok());
    match parsed {
        Some(reply) => (reply.outputs, reply.notes),
        None => (
            Vec::new(),
            vec![format!(
                "rich outputs could not be collected (exit {}): {}",
                r.exit_code,
                crate::fit::quote_tail(r.stderr.trim(), crate::fit::QUOTE_CHARS)
            )],
        ),
    }
}

/// Items parsed at most: a table, and a few the host will drop.
const MAX_ITEMS: usize = 4;
/// UTF-8 length of the largest table kept.
const MAX_HTML_UTF8: usize = RICH_MAX_HTML_BYTES * 4;
const HTML: &str = "text/html";

struct Reply {
    pub outputs: Vec<RichOutput>,
    pub notes: Vec<String>,
}

fn parse(text: &str) -> serde_json::Result<Reply> {
    let mut de = serde_json::Deserializer::from_str(text);
    let reply = de.deserialize_map(ReplyVisitor)?;
    de.end()?;
    Ok(reply)
}

/// `s` cut to at most `max` bytes at a char boundary, marked when cut.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A key of the reply (`outputs`, `notes`) or of an output (`type`, `data`).
enum Key {
    Outputs,
    Notes,
    Type,
    Data,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "outputs" => Key::Outputs,
                    "notes" => Key::Notes,
                    "type" => Key::Type,
                    "data" => Key::Data,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

/// What was dropped, for the notes.
#[derive(Default)]
struct Dropped {
    over_count: usize,
    bad_type: usize,
    too_big: usize,
    notes: usize,
}

struct ReplyVisitor;

impl<'de> Visitor<'de> for ReplyVisitor {
    type Value = Reply;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object with outputs and notes")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Reply, A::Error> {
        let mut outputs = None;
        let mut notes = None;
        let mut dropped = Dropped::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Outputs if outputs.is_none() => {
                    outputs = Some(map.next_value_seed(Outputs(&mut dropped))?)
                }
                Key::Notes if notes.is_none() => {
                    notes = Some(map.next_value_seed(Notes(&mut dropped))?)
                }
                Key::Outputs => return Err(de::Error::duplicate_field("outputs")),
                Key::Notes => return Err(de::Error::duplicate_field("notes")),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let outputs = outputs.ok_or_else(|| de::Error::missing_field("outputs"))?;
        let mut notes = notes.unwrap_or_default();
        let d = dropped;
        if d.over_count > 0 {
            notes.push(format!(
                "{} more rich output(s) dropped: at most one HTML table per run",
                d.over_count
            ));
        }
        if d.bad_type > 0 {
            notes.push(format!(
                "{} rich output(s) dropped: not of type {HTML} (figures come back from the \
                 turn itself, as images)",
                d.bad_type
            ));
        }
        if d.too_big > 0 {
            notes.push(format!(
                "{} rich output(s) dropped: over {RICH_MAX_HTML_BYTES} characters per table",
                d.too_big
            ));
        }
        if d.notes > 0 {
            notes.push(format!(
                "{} more note(s) of the rich output dropped: at most {RICH_MAX_NOTES}",
                d.notes
            ));
        }
        Ok(Reply { outputs, notes })
    }
}

/// The `outputs` list: the first [`MAX_ITEMS`] items are read and checked, the rest
/// skipped and counted.
struct Outputs<'a>(&'a mut Dropped);

impl<'de> DeserializeSeed<'de> for Outputs<'_> {
    type Value = Vec<RichOutput>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Outputs<'_> {
    type Value = Vec<RichOutput>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of outputs")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let dropped = self.0;
        let mut kept: Vec<RichOutput> = Vec::new();
        let mut read = 0;
        loop {
            if read >= MAX_ITEMS {
                match seq.next_element::<IgnoredAny>()? {
                    Some(_) => dropped.over_count += 1,
                    None => break,
                }
                continue;
            }
            let Some((mime, data)) = seq.next_element_seed(Item)? else {
                break;
            };
            read += 1;
            let (Some(Ok(mime)), Some(data)) = (mime, data) else {
                dropped.bad_type += 1;
                continue;
            };
            if mime != HTML {
                dropped.bad_type += 1;
                continue;
            }
            // The prologue measures HTML in characters (`len(html)`).
            match data {
                Ok(data) if data.chars().count() <= RICH_MAX_HTML_BYTES => {
                    if kept.is_empty() {
                        kept.push(RichOutput { mime, data });
                    } else {
                        dropped.over_count += 1;
                    }
                }
                _ => dropped.too_big += 1,
            }
        }
        Ok(kept)
    }
}

/// A string, or its length when it is longer than `max` (then it is not copied).
type Bounded = Result<String, usize>;

/// One output `{"type": ..., "data": ...}`; other keys are skipped.
struct Item;

impl<'de> DeserializeSeed<'de> for Item {
    type Value = (Option<Bounded>, Option<Bounded>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Item {
    type Value = (Option<Bounded>, Option<Bounded>);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an output object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut mime, mut data) = (None, None);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Type if mime.is_none() => {
                    mime = Some(map.next_value_seed(Str {
                        max: 32,
                        cut: false,
                    })?)
                }
                Key::Data if data.is_none() => {
                    data = Some(map.next_value_seed(Str {
                        max: MAX_HTML_UTF8,
                        cut: false,
                    })?)
                }
                Key::Type => return Err(de::Error::duplicate_field("type")),
                Key::Data => return Err(de::Error::duplicate_field("data")),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((mime, data))
    }
}

/// The notes: the first [`RICH_MAX_NOTES`], each cut to [`RICH_MAX_NOTE_BYTES`].
struct Notes<'a>(&'a mut Dropped);

impl<'de> DeserializeSeed<'de> for Notes<'_> {
    type Value = Vec<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Notes<'_> {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of notes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut notes = Vec::new();
        loop {
            if notes.len() >= RICH_MAX_NOTES {
                match seq.next_element::<IgnoredAny>()? {
                    Some(_) => self.0.notes += 1,
                    None => break,
                }
                continue;
            }
            let seed = Str {
                max: RICH_MAX_NOTE_BYTES,
                cut: true,
            };
            match seq.next_element_seed(seed)? {
                Some(Ok(n)) => notes.push(crate::fit::quote(&n, crate::fit::QUOTE_CHARS)),
                Some(Err(_)) => unreachable!("a cut string is never refused"),
                None => break,
            }
        }
        Ok(notes)
    }
}

/// A string of at most `max` bytes: cut to it, or refused (its length) without a copy.
struct Str {
    max: usize,
    cut: bool,
}

impl<'de> DeserializeSeed<'de> for Str {
    type Value = Bounded;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Bounded, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Str {
    type Value = Bounded;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Bounded, E> {
        Ok(match (v.len() <= self.max, self.cut) {
            (true, _) => Ok(v.to_string()),
            (false, true) => Ok(cut(v, self.max)),
            (false, false) => Err(v.len()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_read_to_the_bound_and_noted() {
        let html = r#"{"data":"<table></table>","type":"text/html","extra":[1,{"a":2}]}"#;
        let mut items = vec![
            format!(
                r#"{{"type":"text/html","data":"{}"}}"#,
                "A".repeat(RICH_MAX_HTML_BYTES + 4)
            ),
            r#"{"type":"image/png","data":"iVBORw0KGgo="}"#.to_string(),
            html.to_string(),
        ];
        items.extend(std::iter::repeat_n(html.to_string(), 10_000));
        let notes: Vec<String> = (0..100)
            .map(|_| format!("\"{}\"", "n".repeat(5000)))
            .collect();
        let text = format!(
            r#"{{"outputs":[{}],"notes":[{}],"other":null}}"#,
            items.join(","),
            notes.join(",")
        );
        let r = parse(&text).unwrap();
        // An image is no rich output any more: figures come from the turn, bounded there.
        assert_eq!(r.outputs.len(), 1);
        assert_eq!(r.outputs[0].mime, HTML);
        assert_eq!(
            r.notes.len(),
            RICH_MAX_NOTES + 4,
            "{:?}",
            &r.notes[RICH_MAX_NOTES..]
        );
        assert!(r.notes.iter().all(|n| n.len() <= RICH_MAX_NOTE_BYTES));
        let host = r.notes[RICH_MAX_NOTES..].join("\n");
        for want in ["10000 more rich", "not of type", "over", "84 more note"] {
            assert!(host.contains(want), "{want}: {host}");
        }
    }

    #[test]
    fn what_the_prologue_prints_is_read_as_before() {
        let r = parse(
            r#"{"outputs": [{"type": "text/html", "data": "<b>\u00e9</b>"}], "notes": ["one"]}"#,
        )
        .unwrap();
        assert_eq!(r.outputs.len(), 1);
        assert_eq!(r.outputs[0].data, "<b>é</b>");
        assert_eq!(r.notes, ["one"]);
        assert!(parse(r#"{"notes": []}"#).is_err());
        assert!(parse(r#"{"outputs": [], "outputs": []}"#).is_err());
        assert!(parse(r#"{"outputs": []} trailing"#).is_err());
        assert_eq!(cut("ééé", 5), "é…");
        // Tables are measured in characters, as the prologue does.
        let wide = "é".repeat(RICH_MAX_HTML_BYTES);
        let text =
            format!(r#"{{"outputs": [{{"type": "text/html", "data": "{wide}"}}], "notes": []}}"#);
        assert_eq!(parse(&text).unwrap().outputs.len(), 1);
        let text = text.replacen('é', "éé", 1);
        assert_eq!(parse(&text).unwrap().outputs.len(), 0);
    }
}
