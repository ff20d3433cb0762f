//! Splitting a byte stream into protocol lines, without doing any IO.
//!
//! The supervisor reads an agent's stdout in whatever pieces the pipe gives and
//! feeds them here; the framer hands back whole lines, numbered from 1. Its
//! memory is bounded by the line limit: a line that grows past the limit is
//! reported as soon as that is known and the rest of it is dropped as it
//! arrives, so an agent that floods one endless line cannot make the
//! supervisor buffer it.

use crate::MAX_LINE;

/// One unit of an agent's output stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A whole line, without its `'\n'`.
    Line { no: u64, bytes: Vec<u8> },
    /// Line `no` grew past the limit; `len_so_far` bytes of it had been seen
    /// when that became clear. Its remaining bytes are discarded.
    TooLong { no: u64, len_so_far: usize },
}

/// A sans-IO line splitter with a length limit (see the file docs).
#[derive(Debug)]
pub struct Framer {
    limit: usize,
    /// The line being assembled; never longer than `limit`.
    buf: Vec<u8>,
    /// The number of the line being assembled.
    line_no: u64,
    /// True after a `TooLong`, until that line's newline arrives.
    discarding: bool,
}

impl Default for Framer {
    fn default() -> Self {
        Self::new()
    }
}

impl Framer {
    /// A framer with the protocol's limit, [`MAX_LINE`].
    pub fn new() -> Self {
        Self::with_limit(MAX_LINE)
    }

    /// A framer refusing lines longer than `limit` bytes (not counting `'\n'`).
    pub fn with_limit(limit: usize) -> Self {
        Framer {
            limit,
            buf: Vec::new(),
            line_no: 1,
            discarding: false,
        }
    }

    /// Bytes of the unfinished line held right now (at most the limit).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Capacity of the internal buffer, for checking that memory stays bounded.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Feeds the next bytes of the stream and appends every frame completed by
    /// them to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<Frame>) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|&b| b == b'\n');
            let piece = &bytes[..newline.unwrap_or(bytes.len())];
            bytes = match newline {
                Some(i) => &bytes[i + 1..],
                None => &[],
            };
            if self.discarding {
                if newline.is_some() {
                    self.discarding = false;
                    self.line_no += 1;
                }
                continue;
            }
            let len = self.buf.len() + piece.len();
            if len > self.limit {
                out.push(Frame::TooLong {
                    no: self.line_no,
                    len_so_far: len,
                });
                self.buf.clear();
                if newline.is_some() {
                    self.line_no += 1;
                } else {
                    self.discarding = true;
                }
                continue;
            }
            self.append(piece);
            if newline.is_some() {
                out.push(Frame::Line {
                    no: self.line_no,
                    bytes: std::mem::take(&mut self.buf),
                });
                self.line_no += 1;
            }
        }
    }

    /// Ends the stream: an unfinished last line (no `'\n'` before EOF) becomes a
    /// `Line` too. The framer can then be reused; numbering continues.
    pub fn finish(&mut self, out: &mut Vec<Frame>) {
        if self.discarding {
            // Its TooLong was reported already.
            self.discarding = false;
            self.line_no += 1;
        } else if !self.buf.is_empty() {
            out.push(Frame::Line {
                no: self.line_no,
                bytes: std::mem::take(&mut self.buf),
            });
            self.line_no += 1;
        }
    }

    /// Appends to the line buffer, growing it no further than the limit, so
    /// that the amortised doubling of `Vec` cannot take memory to twice the
    /// limit.
    fn append(&mut self, piece: &[u8]) {
        let needed = self.buf.len() + piece.len();
        if needed > self.buf.capacity() {
            let target = needed.max(self.buf.capacity() * 2).min(self.limit);
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend_from_slice(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(f: &mut Framer, pieces: &[&[u8]]) -> Vec<Frame> {
        let mut out = Vec::new();
        for p in pieces {
            f.push(p, &mut out);
        }
        out
    }

    fn line(no: u64, s: &str) -> Frame {
        Frame::Line {
            no,
            bytes: s.as_bytes().to_vec(),
        }
    }

    #[test]
    fn splits_lines_across_pushes() {
        let mut f = Framer::new();
        let out = frames(
            &mut f,
            &[b"{\"type\":", b"\"ready\"}\n{\"ty", b"pe\":\"pong\"}\n\nab"],
        );
        assert_eq!(
            out,
            vec![
                line(1, "{\"type\":\"ready\"}"),
                line(2, "{\"type\":\"pong\"}"),
                line(3, ""),
            ]
        );
        assert_eq!(f.buffered(), 2);
        let mut out = Vec::new();
        f.push(b"c\n", &mut out);
        assert_eq!(out, vec![line(4, "abc")]);
    }

    #[test]
    fn many_lines_in_one_push_are_numbered() {
        let mut f = Framer::new();
        let out = frames(&mut f, &[b"a\nb\nc\n"]);
        assert_eq!(out, vec![line(1, "a"), line(2, "b"), line(3, "c")]);
    }

    #[test]
    fn finish_turns_a_trailing_partial_line_into_a_line() {
        let mut f = Framer::new();
        let mut out = frames(&mut f, &[b"a\nlast"]);
        f.finish(&mut out);
        assert_eq!(out, vec![line(1, "a"), line(2, "last")]);
        let mut out = Vec::new();
        f.finish(&mut out);
        assert!(out.is_empty(), "nothing buffered, nothing to finish");
    }

    #[test]
    fn exact_limit_accepted_and_one_more_refused() {
        let mut f = Framer::with_limit(4);
        let out = frames(&mut f, &[b"abcd\nabcde\nxy\n"]);
        assert_eq!(
            out,
            vec![
                line(1, "abcd"),
                Frame::TooLong {
                    no: 2,
                    len_so_far: 5
                },
                line(3, "xy"),
            ]
        );
    }

    #[test]
    fn limit_counts_bytes_across_pushes() {
        let mut f = Framer::with_limit(4);
        let out = frames(
            &mut f,
            &[b"ab", b"cd", b"\n", b"ab", b"c", b"de", b"fg\nok\n"],
        );
        assert_eq!(
            out,
            vec![
                line(1, "abcd"),
                Frame::TooLong {
                    no: 2,
                    len_so_far: 5
                },
                line(3, "ok"),
            ]
        );
    }

    #[test]
    fn real_limit_exact_and_over() {
        let mut f = Framer::new();
        let mut exact = vec![b'a'; MAX_LINE];
        exact.push(b'\n');
        let mut over = vec![b'b'; MAX_LINE + 1];
        over.push(b'\n');
        let out = frames(&mut f, &[&exact, &over, b"x\n"]);
        assert_eq!(out.len(), 3);
        assert!(matches!(&out[0], Frame::Line { no: 1, bytes } if bytes.len() == MAX_LINE));
        assert_eq!(
            out[1],
            Frame::TooLong {
                no: 2,
                len_so_far: MAX_LINE + 1
            }
        );
        assert_eq!(out[2], line(3, "x"));
    }

    #[test]
    fn two_mib_line_is_refused_without_buffering_it() {
        let mut f = Framer::new();
        let piece = vec![b'a'; 64 * 1024];
        let mut out = Vec::new();
        for _ in 0..32 {
            f.push(&piece, &mut out);
            assert!(f.buffered() <= MAX_LINE);
            assert!(f.capacity() <= MAX_LINE, "capacity {}", f.capacity());
        }
        assert_eq!(
            out,
            vec![Frame::TooLong {
                no: 1,
                len_so_far: MAX_LINE + 64 * 1024
            }]
        );
        assert_eq!(f.buffered(), 0, "the rest of the long line is dropped");
        f.push(b"aaa\n{\"type\":\"pong\"}\n", &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1], line(2, "{\"type\":\"pong\"}"));
    }

    #[test]
    fn a_long_line_cut_off_by_eof_is_reported_once() {
        let mut f = Framer::with_limit(3);
        let mut out = frames(&mut f, &[b"abcdef"]);
        f.finish(&mut out);
        assert_eq!(
            out,
            vec![Frame::TooLong {
                no: 1,
                len_so_far: 6
            }]
        );
    }
}
