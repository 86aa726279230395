//! Bounded reading of outside input files (the policy, simulated node files) before they reach
//! the YAML parser.
//!
//! The YAML parser's time grows quadratically with nesting depth (`flags: {gfd: [[[[…]]]]}` at
//! depth 8,000 takes 0.3 s, a 400 KB file minutes), and reading a FIFO or `/dev/zero` never ends.
//! [`read_bounded`] therefore refuses, before any parsing:
//! - anything but a regular file (a FIFO, a character or block device, a socket, a directory),
//!   decided by [`std::fs::metadata`], which follows symlinks as a ConfigMap's `..data` link
//!   needs;
//! - files larger than [`Limits::max_bytes`] (default [`DEFAULT_MAX_BYTES`] = 1 MiB, the
//!   Kubernetes ConfigMap size limit); at most `max_bytes + 1` bytes are ever read, so a file
//!   that grows while it is read is still refused;
//! - text that is not UTF-8 ([`ReadError::InvalidUtf8`] with the byte offset): YAML 1.2 text is
//!   Unicode, and `slicelet validate` and the daemon both read through here, so a file one
//!   accepts the other accepts too (no lossy decoding anywhere);
//! - nesting deeper than [`Limits::max_depth`] flow levels (default [`DEFAULT_MAX_DEPTH`] = 64)
//!   or block indentation wider than [`Limits::max_indent`] columns (default
//!   [`DEFAULT_MAX_INDENT`] = 256), found by [`check_nesting`], a linear scan.
//!
//! A UTF-8 byte-order mark at the start is accepted (and dropped by [`super::parse`]).

use std::io::Read as _;
use std::path::{Path, PathBuf};

/// Default size limit in bytes: 1 MiB, the most a Kubernetes ConfigMap holds.
pub const DEFAULT_MAX_BYTES: u64 = 1024 * 1024;
/// Default limit on flow nesting (`[`/`{` inside each other). NVIDIA's schema nests 4 levels.
pub const DEFAULT_MAX_DEPTH: usize = 64;
/// Default limit on the column where a line's content starts, counting block-sequence and
/// mapping indicators (`- - - x` starts at column 6). A policy written with 2-space
/// indentation uses about 12.
pub const DEFAULT_MAX_INDENT: usize = 256;

/// Limits applied by [`read_bounded`] and [`check_nesting`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted file, in bytes.
    pub max_bytes: u64,
    /// Deepest accepted flow nesting, in levels.
    pub max_depth: usize,
    /// Widest accepted block indentation, in columns.
    pub max_indent: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
            max_indent: DEFAULT_MAX_INDENT,
        }
    }
}

/// An input file was refused before parsing; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The path is not a regular file (`kind` says what it is: "FIFO", "directory", …).
    #[error("{} is a {kind}, not a regular file", path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// The file is larger than the limit.
    #[error("{} is larger than {limit} bytes (the limit, as for a Kubernetes ConfigMap)", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit in bytes.
        limit: u64,
    },
    /// The file is not valid UTF-8.
    #[error("{} is not valid UTF-8 at byte {offset}", path.display())]
    InvalidUtf8 {
        /// The file.
        path: PathBuf,
        /// Offset of the first invalid byte (0-based).
        offset: usize,
    },
    /// The text nests deeper than the limits.
    #[error("{}", path.display())]
    TooDeep {
        /// The file.
        path: PathBuf,
        /// Where and how deep.
        source: NestingError,
    },
    /// The file could not be opened or read.
    #[error("reading {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl ReadError {
    /// The file this error is about.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::NotRegular { path, .. }
            | ReadError::TooLarge { path, .. }
            | ReadError::InvalidUtf8 { path, .. }
            | ReadError::TooDeep { path, .. }
            | ReadError::Io { path, .. } => path,
        }
    }

    /// Whether the file does not exist (or a directory on its path does not).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Text nests deeper than [`Limits`] allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NestingError {
    /// Flow collections (`[`, `{`) nest deeper than the limit.
    #[error("nesting deeper than {limit} levels of [ and {{ at line {line}")]
    Flow {
        /// 1-based line where the limit was passed.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// A line's content starts further right than the limit.
    #[error("indentation deeper than {limit} columns at line {line}")]
    Indent {
        /// 1-based line.
        line: usize,
        /// The limit.
        limit: usize,
    },
}

/// Reads the UTF-8 text of the regular file at `path` within `limits`.
///
/// Blocking (file I/O); the daemon calls it off its event loop. The check is on the file the
/// path resolves to (symlinks followed), then at most `limits.max_bytes + 1` bytes are read.
///
/// # Errors
/// [`ReadError`] naming `path`: not a regular file, too large, not UTF-8 (with the byte
/// offset), nested too deep, or an I/O error.
pub fn read_bounded(path: &Path, limits: &Limits) -> Result<String, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if let Some(kind) = not_regular(&meta.file_type()) {
        return Err(ReadError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    let too_large = || ReadError::TooLarge {
        path: path.to_path_buf(),
        limit: limits.max_bytes,
    };
    if meta.len() > limits.max_bytes {
        return Err(too_large());
    }
    // Non-blocking, so that a FIFO swapped in between the check above and this open cannot
    // block the open (reads of a regular file are unaffected by the flag).
    let file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(io)?
    };
    // The file may have been swapped for another between metadata and open.
    let opened = file.metadata().map_err(io)?;
    if let Some(kind) = not_regular(&opened.file_type()) {
        return Err(ReadError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    let mut bytes =
        Vec::with_capacity(usize::try_from(opened.len().min(limits.max_bytes)).unwrap_or(0));
    file.take(limits.max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limits.max_bytes {
        return Err(too_large());
    }
    let text = String::from_utf8(bytes).map_err(|e| ReadError::InvalidUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    check_nesting(&text, limits).map_err(|source| ReadError::TooDeep {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(text)
}

fn not_regular(t: &std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("directory")
    } else if t.is_fifo() {
        Some("FIFO (named pipe)")
    } else if t.is_char_device() {
        Some("character device")
    } else if t.is_block_device() {
        Some("block device")
    } else if t.is_socket() {
        Some("socket")
    } else {
        Some("special file")
    }
}

/// Checks in one linear pass that YAML `text` nests no deeper than `limits.max_depth` flow
/// levels and indents no wider than `limits.max_indent` columns.
///
/// The scan errs on the safe side: every `[` and `{` counts as an opening, even inside a
/// string or comment, so no nesting a YAML parser would see can hide from it. A `]` or `}`
/// closes only outside strings and comments, or inside a string or comment that opened one
/// itself.
/// Strings are recognised where a node starts (a line start outside flow collections, after
/// `[`, `{`, `,`, `:`, `-`, `?`, a tag or an anchor), double-quoted with `\` escapes and
/// single-quoted with `''`; comments start at `#` after a blank. A file with unbalanced
/// brackets in its strings may therefore be counted deeper than it is, never shallower.
///
/// # Errors
/// [`NestingError`] with the line where a limit is passed.
pub fn check_nesting(text: &str, limits: &Limits) -> Result<(), NestingError> {
    let mut scan = Scan {
        b: text.as_bytes(),
        limits,
        state: In::Plain,
        depth: 0,
        in_string: 0,
        line: 1,
        at_line_start: true,
        column: 0,
        node_start: true,
        after_blank: true,
        i: 0,
    };
    while scan.i < scan.b.len() {
        scan.step()?;
    }
    Ok(())
}

/// Where [`check_nesting`]'s scan is: outside strings and comments, or in one.
#[derive(PartialEq)]
enum In {
    Plain,
    Comment,
    Double,
    Single,
}

/// [`check_nesting`]'s scan of one text.
struct Scan<'a> {
    b: &'a [u8],
    limits: &'a Limits,
    state: In,
    depth: usize,
    /// Openings inside the current string or comment, which its own closings may cancel.
    in_string: usize,
    line: usize,
    at_line_start: bool,
    column: usize,
    /// Whether a quote here would start a quoted scalar.
    node_start: bool,
    /// Whether the previous byte was a blank (or a line start), for `#`.
    after_blank: bool,
    /// The byte being read.
    i: usize,
}

impl Scan<'_> {
    /// Reads the byte at `i` (and any it consumes with it), then moves past it.
    fn step(&mut self) -> Result<(), NestingError> {
        let c = self.b[self.i];
        if c == b'\n' {
            self.newline();
            self.i += 1;
            return Ok(());
        }
        self.count_bracket(c)?;
        match self.state {
            In::Comment => {}
            In::Double => self.in_double(c),
            In::Single => self.in_single(c),
            In::Plain => self.in_plain(c)?,
        }
        self.i += 1;
        Ok(())
    }

    /// A line break: ends a comment; outside strings, a new line starts.
    fn newline(&mut self) {
        self.line += 1;
        if self.state == In::Comment {
            self.state = In::Plain;
        }
        if self.state == In::Plain {
            self.at_line_start = true;
            self.column = 0;
            self.after_blank = true;
            // Outside flow collections a line may start a new node; inside one a quote
            // after a line break may continue a plain scalar, so only indicators count.
            self.node_start = self.depth == 0 || self.node_start;
        }
    }

    /// Every `[` and `{` opens (past the depth limit: the error); `]` and `}` close outside
    /// strings and comments, or inside one that opened one itself.
    fn count_bracket(&mut self, c: u8) -> Result<(), NestingError> {
        match c {
            b'[' | b'{' => {
                self.depth += 1;
                if self.depth > self.limits.max_depth {
                    return Err(NestingError::Flow {
                        line: self.line,
                        limit: self.limits.max_depth,
                    });
                }
                if self.state != In::Plain {
                    self.in_string += 1;
                }
            }
            b']' | b'}' => match self.state {
                In::Plain => self.depth = self.depth.saturating_sub(1),
                In::Comment | In::Double | In::Single => {
                    if self.in_string > 0 {
                        self.in_string -= 1;
                        self.depth -= 1;
                    }
                }
            },
            _ => {}
        }
        Ok(())
    }

    /// Inside a double-quoted string: `\` escapes the next byte, `"` ends it.
    fn in_double(&mut self, c: u8) {
        match c {
            b'\\' => {
                if self.b.get(self.i + 1) == Some(&b'\n') {
                    self.line += 1;
                }
                self.i += 1;
            }
            b'"' => {
                self.state = In::Plain;
                self.node_start = false;
            }
            _ => {}
        }
    }

    /// Inside a single-quoted string: `''` is a quote, `'` ends it.
    fn in_single(&mut self, c: u8) {
        if c == b'\'' {
            if self.b.get(self.i + 1) == Some(&b'\'') {
                self.i += 1;
            } else {
                self.state = In::Plain;
                self.node_start = false;
            }
        }
    }

    /// Outside strings and comments: indentation at a line start (past the indent limit: the
    /// error), then what starts a comment, a string, a node or a tag.
    fn in_plain(&mut self, c: u8) -> Result<(), NestingError> {
        if self.at_line_start {
            if self.indentation(c)? {
                return Ok(());
            }
            self.at_line_start = false;
        }
        match c {
            b'#' if self.after_blank => {
                self.state = In::Comment;
                self.in_string = 0;
            }
            b'"' | b'\'' if self.node_start => {
                self.state = if c == b'"' { In::Double } else { In::Single };
                self.in_string = 0;
            }
            b'[' | b'{' | b',' | b':' | b'-' | b'?' => self.node_start = true,
            b']' | b'}' => self.node_start = false,
            b' ' | b'\t' | b'\r' => {}
            b'!' | b'&' if self.node_start => {
                // A tag or anchor: the node starts after it.
                // Tags and anchors end at a blank or a flow indicator.
                while self.i + 1 < self.b.len()
                    && !matches!(
                        self.b[self.i + 1],
                        b' ' | b'\t' | b'\n' | b'[' | b']' | b'{' | b'}' | b','
                    )
                {
                    self.i += 1;
                }
            }
            _ => self.node_start = false,
        }
        self.after_blank = matches!(c, b' ' | b'\t');
        Ok(())
    }

    /// At a line start: whether `c` is indentation or a block indicator followed by a blank
    /// (it counts as a column then).
    fn indentation(&mut self, c: u8) -> Result<bool, NestingError> {
        let is_indicator = matches!(c, b'-' | b'?' | b':')
            && matches!(self.b.get(self.i + 1), Some(b' ' | b'\t' | b'\n') | None);
        if !(c == b' ' || c == b'\t' || is_indicator) {
            return Ok(false);
        }
        self.column += 1;
        if self.column > self.limits.max_indent {
            return Err(NestingError::Indent {
                line: self.line,
                limit: self.limits.max_indent,
            });
        }
        if is_indicator {
            self.node_start = true;
        }
        self.after_blank = true;
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
