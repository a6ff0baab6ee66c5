//! Writing SVG: escaping, text with a known width, rectangles for overlap checks.
//!
//! Every label is set in a monospace face with an explicit `textLength`, so the box the layout
//! reserves for it is the box the browser draws it in (`lengthAdjust="spacingAndGlyphs"` fits
//! the glyphs to the length): the width of a character is taken as 0.602 em, the advance of
//! DejaVu Sans Mono (1233 of 2048 units), the face Debian's browsers fall back to for
//! `monospace`, so the fit changes nothing there.

use std::fmt::Write as _;

/// Advance of one character in em (DejaVu Sans Mono: 1233/2048).
pub const ADVANCE: f64 = 0.602;
/// Top of a label's box above its baseline, in em (DejaVu's cap height is 0.73 em; accents
/// reach a little higher).
const ASCENT: f64 = 0.78;
/// Bottom of a label's box below its baseline, in em (descenders).
const DESCENT: f64 = 0.24;

/// Width in px of `text` at `size` px.
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * ADVANCE * size
}

/// `text` cut to at most `max_px` wide at `size` px, with `…` when cut.
pub fn fit(text: &str, size: f64, max_px: f64) -> String {
    // Measured as shown: a hidden character takes the width of its `\u{…}`.
    let text = &visible(text);
    let max = (max_px / (ADVANCE * size)).floor().max(1.0) as usize;
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// Escapes text for XML content and attribute values: the page's one rule for every text,
/// untrusted or not. Markup characters become entities, and characters that act instead of
/// showing ([`gdpath_topo::text::hidden`]: controls XML 1.0 forbids, bidi overrides and
/// isolates that would reorder a label, zero-width characters) are written visibly as
/// `\u{202e}`, as the terminal rule does; tab and newlines are kept.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => push_visible(&mut o, c),
        }
    }
    o
}

/// `s` with every hidden character ([`gdpath_topo::text::hidden`]) written as `\u{…}`, as
/// [`esc`] shows it: the text a label's width is measured on.
pub fn visible(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        push_visible(&mut o, c);
    }
    o
}

/// Pushes `c`, or `\u{…}` for a hidden character other than tab and newlines.
fn push_visible(o: &mut String, c: char) {
    if gdpath_topo::text::hidden(c) && !matches!(c, '\t' | '\n' | '\r') {
        let _ = write!(o, "\\u{{{:x}}}", c as u32);
    } else {
        o.push(c);
    }
}

/// An axis-aligned rectangle, px.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rect {
    /// Left edge, px.
    pub x: f64,
    /// Top edge, px.
    pub y: f64,
    /// Width, px.
    pub w: f64,
    /// Height, px.
    pub h: f64,
}

impl Rect {
    /// The rectangle with its top-left corner at (`x`, `y`), `w` wide and `h` high, px.
    pub fn new(x: f64, y: f64, w: f64, h: f64) -> Rect {
        Rect { x, y, w, h }
    }
    /// Right edge, px.
    pub fn right(&self) -> f64 {
        self.x + self.w
    }
    /// Bottom edge, px.
    pub fn bottom(&self) -> f64 {
        self.y + self.h
    }
    /// Horizontal centre, px.
    pub fn cx(&self) -> f64 {
        self.x + self.w / 2.0
    }
    /// True when the two share interior area (touching edges do not count).
    pub fn overlaps(&self, o: &Rect) -> bool {
        self.x < o.right() - 0.01
            && o.x < self.right() - 0.01
            && self.y < o.bottom() - 0.01
            && o.y < self.bottom() - 0.01
    }
    /// True when `o` lies within this rectangle.
    pub fn contains(&self, o: &Rect) -> bool {
        o.x >= self.x - 0.01
            && o.y >= self.y - 0.01
            && o.right() <= self.right() + 0.01
            && o.bottom() <= self.bottom() + 0.01
    }
    /// Grown by `d` on every side.
    pub fn grow(&self, d: f64) -> Rect {
        Rect::new(self.x - d, self.y - d, self.w + 2.0 * d, self.h + 2.0 * d)
    }
}

/// Horizontal anchor of a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The text starts at `x`.
    Start,
    /// The text is centred on `x`.
    Middle,
    /// The text ends at `x`.
    End,
}

/// One label: where it sits, how large, and its CSS class.
#[derive(Debug, Clone, PartialEq)]
pub struct Text {
    /// Horizontal anchor point, px (see `anchor`).
    pub x: f64,
    /// Baseline.
    pub y: f64,
    /// Font size, px.
    pub size: f64,
    /// How the text sits on `x`.
    pub anchor: Anchor,
    /// The text as shown (hidden characters written `\u{…}` by [`visible`]; markup escaped
    /// when written).
    pub text: String,
    /// CSS class of the `<text>` element.
    pub class: &'static str,
    /// A fill colour of its own, written inline (it wins over every class rule, whatever else
    /// is on the page).
    pub fill: Option<&'static str>,
}

impl Text {
    /// A label at (`x`, baseline `y`) of `size` px, anchored at its start, with no fill of its own.
    pub fn new(x: f64, y: f64, size: f64, text: impl Into<String>, class: &'static str) -> Text {
        Text {
            x,
            y,
            size,
            anchor: Anchor::Start,
            text: visible(&text.into()),
            class,
            fill: None,
        }
    }

    /// The label anchored at `x` by `a` instead.
    pub fn anchored(mut self, a: Anchor) -> Text {
        self.anchor = a;
        self
    }

    /// Width of the label in px at its size ([`text_width`]).
    pub fn width(&self) -> f64 {
        text_width(&self.text, self.size)
    }

    /// The box the label is drawn in.
    pub fn rect(&self) -> Rect {
        let w = self.width();
        let x0 = match self.anchor {
            Anchor::Start => self.x,
            Anchor::Middle => self.x - w / 2.0,
            Anchor::End => self.x - w,
        };
        text_rect(x0, self.y, w, self.size)
    }

    /// The `<text>` element.
    pub fn write(&self, out: &mut String) {
        if self.text.is_empty() {
            return;
        }
        let anchor = match self.anchor {
            Anchor::Start => "",
            Anchor::Middle => " text-anchor=\"middle\"",
            Anchor::End => " text-anchor=\"end\"",
        };
        let style = self
            .fill
            .map(|c| format!(" style=\"fill:{}\"", esc(c)))
            .unwrap_or_default();
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"{}\" textLength=\"{:.1}\" \
             lengthAdjust=\"spacingAndGlyphs\" class=\"{}\"{anchor}{style}>{}</text>",
            self.x,
            self.y,
            self.size,
            self.width(),
            self.class,
            esc(&self.text)
        );
    }
}

/// The box of a label whose left edge is `x0`, baseline `y`, width `w` at `size` px.
pub fn text_rect(x0: f64, y: f64, w: f64, size: f64) -> Rect {
    Rect::new(x0, y - ASCENT * size, w, (ASCENT + DESCENT) * size)
}

/// Formats a number for an attribute (one decimal).
pub fn num(v: f64) -> String {
    format!("{v:.1}")
}

/// An SVG path `d` for a polyline.
pub fn polyline_d(pts: &[(f64, f64)]) -> String {
    let mut d = String::new();
    for (i, (x, y)) in pts.iter().enumerate() {
        let _ = write!(d, "{}{:.1} {:.1}", if i == 0 { "M" } else { " L" }, x, y);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_fitting() {
        assert_eq!(esc("a<b & \"c\"\u{1}"), "a&lt;b &amp; &quot;c&quot;\\u{1}");
        // Issue 42: a bidi override or isolate in a log's `via` reordered the label shown.
        assert_eq!(
            esc("P2P/\u{202e}\u{2066}bidi\u{200b}\u{7f}\u{85}"),
            "P2P/\\u{202e}\\u{2066}bidi\\u{200b}\\u{7f}\\u{85}"
        );
        assert_eq!(esc("NVIDIA → é e\u{301} 東"), "NVIDIA → é e\u{301} 東");
        assert_eq!(fit("NVIDIA A100-SXM4-40GB", 10.0, 60.0), "NVIDIA A…");
        assert_eq!(fit("GPU0", 10.0, 60.0), "GPU0");
        let t = Text::new(10.0, 20.0, 10.0, "abcd", "x").anchored(Anchor::Middle);
        let r = t.rect();
        assert!((r.w - 24.08).abs() < 1e-9 && (r.cx() - 10.0).abs() < 1e-9);
        assert!(r.overlaps(&Rect::new(r.right() - 1.0, r.y, 5.0, 5.0)));
        assert!(!r.overlaps(&Rect::new(r.right(), r.y, 5.0, 5.0)));
    }
}
