//! Images a run hands back: the matplotlib figures a Python turn leaves open (or shows).
//!
//! They reach the host through the guest's `host.call`, never through stdout or
//! stderr, so nothing a run prints (its own output, a file it cats, a subprocess's) can pass
//! for an image. The host bounds them here whatever the guest sends: a count and a total of
//! base64 bytes, shared with rich mode, that keeps a whole answer well under rmcp's 16 MiB
//! stdio line.

use base64::Engine as _;

use super::RichOutput;

/// How many images one run may return, and their base64 bytes together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageBudget {
    pub max_images: usize,
    pub max_base64_bytes: usize,
}

/// The most base64 one answer's images may take: with the text block and `structuredContent`
/// (each bounded by `WASMBOX_RESULT_BYTES`) the JSON-RPC line stays under rmcp's 16 MiB.
pub const MAX_IMAGE_BASE64_BYTES: usize = 12 << 20;

impl ImageBudget {
    /// The defaults: 4 images, 6 MiB of base64 (about 4.5 MB of PNG).
    pub const DEFAULT: Self = Self {
        max_images: 4,
        max_base64_bytes: 6 << 20,
    };

    /// A budget from the knobs, its bytes held under [`MAX_IMAGE_BASE64_BYTES`]; `None` when
    /// the count is 0 (no figure is collected).
    pub fn new(max_images: usize, max_base64_bytes: usize) -> Option<Self> {
        (max_images > 0).then(|| Self {
            max_images,
            max_base64_bytes: max_base64_bytes.min(MAX_IMAGE_BASE64_BYTES),
        })
    }
}

/// The frames of `host.call` that carry figures: a PNG, a figure left out unrendered (past the
/// count), a note from the guest (a figure that could not be rendered).
const PNG_FRAME: &[u8] = b"wasmbox:png\n";
const SKIP_FRAME: &[u8] = b"wasmbox:skip\n";
const NOTE_FRAME: &[u8] = b"wasmbox:note\n";
const MAX_NOTES: usize = 4;
const MAX_NOTE_BYTES: usize = 512;

/// The largest frame `host.call` reads for the budget's images (a bigger one is refused unread).
pub fn max_frame(budget: &ImageBudget) -> usize {
    PNG_FRAME.len() + budget.max_base64_bytes / 4 * 3 + 3
}

/// The MIME type of an image by its first bytes (PNG, JPEG, GIF, WebP), not by a file name.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// rmcp's stdio transport drops a JSON-RPC line longer than this (the call then never answers).
pub const LINE_LIMIT: usize = 16 << 20;

/// The MIME type under which a downloaded file also goes out as an image block: when it is
/// an image by its bytes, was read whole (a cut image shows nothing), and a third copy of its
/// base64 (`base64_len`; the text block and `structuredContent` hold two) still fits the line.
pub fn download_image(bytes: &[u8], whole: bool, base64_len: usize) -> Option<&'static str> {
    let fits = base64_len.saturating_mul(3) + (256 << 10) <= LINE_LIMIT;
    sniff(bytes).filter(|_| whole && fits)
}

/// What one run's turn handed over, within its budget. Unarmed (no budget), it takes nothing
/// and `host.call` answers as if no host were bound.
#[derive(Debug, Default)]
pub struct ImageSink {
    budget: Option<ImageBudget>,
    images: Vec<RichOutput>,
    base64_bytes: usize,
    over_count: usize,
    over_size: usize,
    not_png: usize,
    notes: Vec<String>,
}

impl ImageSink {
    pub fn new(budget: Option<ImageBudget>) -> Self {
        Self {
            budget,
            ..Default::default()
        }
    }

    pub fn budget(&self) -> Option<&ImageBudget> {
        self.budget.as_ref()
    }

    /// Takes one `host.call` frame. `false` when it is not a figure frame or the sink is unarmed.
    pub fn offer(&mut self, frame: &[u8]) -> bool {
        let Some(budget) = self.budget else {
            return false;
        };
        if let Some(png) = frame.strip_prefix(PNG_FRAME) {
            let b64 = png.len().div_ceil(3) * 4;
            if sniff(png) != Some("image/png") {
                self.not_png += 1;
            } else if self.images.len() >= budget.max_images {
                self.over_count += 1;
            } else if self.base64_bytes + b64 > budget.max_base64_bytes {
                self.over_size += 1;
            } else {
                self.base64_bytes += b64;
                self.images.push(RichOutput {
                    mime: "image/png".into(),
                    data: base64::engine::general_purpose::STANDARD.encode(png),
                });
            }
        } else if frame == SKIP_FRAME {
            self.over_count += 1;
        } else if let Some(note) = frame.strip_prefix(NOTE_FRAME) {
            if self.notes.len() < MAX_NOTES {
                let note = String::from_utf8_lossy(note);
                let mut end = note.len().min(MAX_NOTE_BYTES);
                while !note.is_char_boundary(end) {
                    end -= 1;
                }
                let note = crate::fit::quote(&note[..end], crate::fit::QUOTE_CHARS);
                self.notes.push(format!("wasmbox: {note}"));
            }
        } else {
            return false;
        }
        true
    }

    /// Takes a frame too big for the whole budget: a PNG frame is counted as over it.
    pub fn offer_oversized(&mut self, frame: &[u8]) -> bool {
        let png = self.budget.is_some() && frame.starts_with(PNG_FRAME);
        self.over_size += usize::from(png);
        png
    }

    /// The images taken, and notes on what was left out and why; the sink is emptied.
    pub fn take(&mut self) -> (Vec<RichOutput>, Vec<String>) {
        let images = std::mem::take(&mut self.images);
        let mut notes = std::mem::take(&mut self.notes);
        let Some(b) = self.budget else {
            return (images, notes);
        };
        let left_out = self.over_count + self.over_size;
        if left_out > 0 {
            notes.push(format!(
                "wasmbox: {left_out} figure(s) not returned as images: a run returns at most {} \
                 image(s) and {} bytes of base64 in all (WASMBOX_IMAGES, WASMBOX_IMAGE_BYTES). \
                 Save a figure to a file instead (fig.savefig('/workspace/plot.png', dpi=80)) \
                 in a sandbox and fetch it with file_download, or make fewer or smaller figures",
                b.max_images,
                crate::fit::thousands(b.max_base64_bytes as u64)
            ));
        }
        if self.not_png > 0 {
            notes.push(format!(
                "wasmbox: {} figure frame(s) dropped: not PNG",
                self.not_png
            ));
        }
        (self.over_count, self.over_size, self.not_png) = (0, 0, 0);
        self.base64_bytes = 0;
        (images, notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\nrest";

    fn frame(png: &[u8]) -> Vec<u8> {
        [PNG_FRAME, png].concat()
    }

    #[test]
    fn an_unarmed_sink_takes_nothing() {
        let mut s = ImageSink::new(None);
        assert!(!s.offer(&frame(PNG)));
        assert_eq!(s.take().0.len(), 0);
    }

    #[test]
    fn the_count_and_the_bytes_are_bounded_and_noted() {
        let b64 = PNG.len().div_ceil(3) * 4;
        let mut s = ImageSink::new(ImageBudget::new(3, b64 * 2));
        for _ in 0..4 {
            assert!(s.offer(&frame(PNG)));
        }
        assert!(s.offer(SKIP_FRAME));
        assert!(s.offer(&frame(b"GIF89a")));
        assert!(!s.offer(b"wasmbox:other\n"), "other frames are not ours");
        assert!(s.offer_oversized(&frame(PNG)));
        assert!(!s.offer_oversized(b"wasmbox:other\n"));
        let (images, notes) = s.take();
        assert_eq!(images.len(), 2, "two fit the bytes");
        assert_eq!(images[0].data, "iVBORw0KGgpyZXN0");
        let notes = notes.join("\n");
        assert!(notes.contains("4 figure(s) not returned"), "{notes}");
        assert!(notes.contains("file_download"), "{notes}");
        assert!(notes.contains("not PNG"), "{notes}");
        let (images, notes) = s.take();
        assert!(images.is_empty() && notes.is_empty(), "taking empties it");
    }

    #[test]
    fn notes_are_bounded() {
        let mut s = ImageSink::new(Some(ImageBudget::DEFAULT));
        for _ in 0..100 {
            s.offer(&[NOTE_FRAME, "é".repeat(1000).as_bytes()].concat());
        }
        let (_, notes) = s.take();
        assert_eq!(notes.len(), MAX_NOTES);
        assert!(notes.iter().all(|n| n.len() <= MAX_NOTE_BYTES + 16));
    }

    #[test]
    fn images_are_sniffed_by_content() {
        assert_eq!(sniff(PNG), Some("image/png"));
        assert_eq!(sniff(b"\xff\xd8\xff\xe0"), Some("image/jpeg"));
        assert_eq!(sniff(b"GIF87a.."), Some("image/gif"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(sniff(b"hello"), None);
    }

    #[test]
    fn a_download_is_an_image_when_whole_and_small_enough() {
        assert_eq!(download_image(PNG, true, 16), Some("image/png"));
        assert_eq!(download_image(PNG, false, 16), None);
        assert_eq!(download_image(b"text", true, 8), None);
        assert_eq!(download_image(PNG, true, 4 << 20), Some("image/png"));
        assert_eq!(download_image(PNG, true, (4 << 20) * 4 / 3), None);
    }

    #[test]
    fn the_bytes_stay_under_the_line() {
        let b = ImageBudget::new(4, usize::MAX).unwrap();
        assert_eq!(b.max_base64_bytes, MAX_IMAGE_BASE64_BYTES);
        assert_eq!(ImageBudget::new(0, 1), None);
    }
}
