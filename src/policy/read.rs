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
    #[derive(PartialEq)]
    enum In {
        Plain,
        Comment,
        Double,
        Single,
    }
    let b = text.as_bytes();
    let mut state = In::Plain;
    let mut depth = 0usize;
    // Openings inside the current string or comment, which its own closings may cancel.
    let mut in_string = 0usize;
    let mut line = 1usize;
    let mut at_line_start = true;
    let mut column = 0usize;
    // Whether a quote here would start a quoted scalar.
    let mut node_start = true;
    // Whether the previous byte was a blank (or a line start), for `#`.
    let mut after_blank = true;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            if state == In::Comment {
                state = In::Plain;
            }
            if state == In::Plain {
                at_line_start = true;
                column = 0;
                after_blank = true;
                // Outside flow collections a line may start a new node; inside one a quote
                // after a line break may continue a plain scalar, so only indicators count.
                node_start = depth == 0 || node_start;
            }
            i += 1;
            continue;
        }
        match c {
            b'[' | b'{' => {
                depth += 1;
                if depth > limits.max_depth {
                    return Err(NestingError::Flow {
                        line,
                        limit: limits.max_depth,
                    });
                }
                if state != In::Plain {
                    in_string += 1;
                }
            }
            b']' | b'}' => match state {
                In::Plain => depth = depth.saturating_sub(1),
                In::Comment | In::Double | In::Single => {
                    if in_string > 0 {
                        in_string -= 1;
                        depth -= 1;
                    }
                }
            },
            _ => {}
        }
        match state {
            In::Comment => {}
            In::Double => match c {
                b'\\' => {
                    if b.get(i + 1) == Some(&b'\n') {
                        line += 1;
                    }
                    i += 1;
                }
                b'"' => {
                    state = In::Plain;
                    node_start = false;
                }
                _ => {}
            },
            In::Single => {
                if c == b'\'' {
                    if b.get(i + 1) == Some(&b'\'') {
                        i += 1;
                    } else {
                        state = In::Plain;
                        node_start = false;
                    }
                }
            }
            In::Plain => {
                if at_line_start {
                    // Indentation and block indicators followed by a blank.
                    let is_indicator = matches!(c, b'-' | b'?' | b':')
                        && matches!(b.get(i + 1), Some(b' ' | b'\t' | b'\n') | None);
                    if c == b' ' || c == b'\t' || is_indicator {
                        column += 1;
                        if column > limits.max_indent {
                            return Err(NestingError::Indent {
                                line,
                                limit: limits.max_indent,
                            });
                        }
                        if is_indicator {
                            node_start = true;
                        }
                        after_blank = true;
                        i += 1;
                        continue;
                    }
                    at_line_start = false;
                }
                match c {
                    b'#' if after_blank => {
                        state = In::Comment;
                        in_string = 0;
                    }
                    b'"' | b'\'' if node_start => {
                        state = if c == b'"' { In::Double } else { In::Single };
                        in_string = 0;
                    }
                    b'[' | b'{' | b',' | b':' | b'-' | b'?' => node_start = true,
                    b']' | b'}' => node_start = false,
                    b' ' | b'\t' | b'\r' => {}
                    b'!' | b'&' if node_start => {
                        // A tag or anchor: the node starts after it.
                        // Tags and anchors end at a blank or a flow indicator.
                        while i + 1 < b.len()
                            && !matches!(
                                b[i + 1],
                                b' ' | b'\t' | b'\n' | b'[' | b']' | b'{' | b'}' | b','
                            )
                        {
                            i += 1;
                        }
                    }
                    _ => node_start = false,
                }
                after_blank = matches!(c, b' ' | b'\t');
            }
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
