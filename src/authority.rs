//! Every gRPC client a node uses gets answers, whatever `:authority` it sends.
//!
//! The kubelet's plugin watcher dials a registration socket with
//! `grpc.DialContext(ctx, "/var/lib/kubelet/plugins_registry/…-reg.sock", WithContextDialer(…))`:
//! a plain path, no `unix:` scheme, no `WithAuthority`. grpc-go then sends the path itself as
//! the HTTP/2 `:authority` (verbatim before grpc-go 1.5x, percent-encoded `%2Fvar%2F…` after);
//! grpc C-core (Python `grpcio`, grpcurl's C clients) sends the percent-encoded path for any
//! `unix:` target. h2, under tonic, refuses either as a malformed authority and resets the
//! stream (`RST_STREAM PROTOCOL_ERROR`; hyperium/h2#487, still open), so `GetInfo` fails and the
//! kubelet never registers the plugin.
//!
//! [`AnyAuthority`] wraps an accepted connection on the way into h2 and reads the client's
//! frames. The connection's first header block (`HEADERS` and its `CONTINUATION`s) is
//! decoded with HPACK (`loona-hpack`). When its `:authority` is one [`http::uri::Authority`]
//! accepts (or absent), the block and everything after it pass byte for byte: gRPC clients
//! send one authority per connection, so a well-formed client (tonic, the kubelet's device
//! manager with `localhost`) costs one decode per connection, not per request. Otherwise the
//! connection is rewritten: every block is decoded (the decoder keeps the client's dynamic
//! table), the refused `:authority` becomes `localhost` (what kubelets ≥ 1.26 send on the
//! device-plugin sockets, kubernetes/kubernetes#112597), and the block is re-encoded as
//! literals without indexing, so h2's own decoder never needs a dynamic-table entry it was not
//! sent. Non-header frames, and everything the server writes, always pass byte for byte;
//! requests reach h2 with the same headers in the same order.
//!
//! Limits (a hostile peer is refused at least as h2 would refuse it, by ending the
//! connection): a header frame over [`MAX_FRAME`] bytes, a header block over [`MAX_BLOCK`]
//! compressed bytes or decoding to over [`MAX_BLOCK`] bytes (RFC 7541 §4.1 sizes), an HPACK
//! error, a dynamic-table size above the 4,096 bytes h2 advertises or a size update after a
//! header field (RFC 7541 §4.2, which `loona-hpack` lets pass), a `CONTINUATION` that
//! does not follow its `HEADERS`, or another frame inside a header block. h2 still applies its
//! own header-list limit to what passes (16 KiB by default).
//!
//! A connection that does not start with the HTTP/2 client preface (RFC 9113 §3.4) is passed
//! through untouched: h2 refuses it itself.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface (RFC 9113 §3.4), 24 bytes.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame header length (RFC 9113 §4.1), bytes.
const FRAME_HEADER: usize = 9;
/// Frame types and flags (RFC 9113 §6).
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// Largest header frame accepted and largest frame written, bytes: `SETTINGS_MAX_FRAME_SIZE`'s
/// initial value (RFC 9113 §6.5.2), which h2 (under tonic) keeps.
pub const MAX_FRAME: usize = 16_384;
/// Largest header block, compressed or decoded, bytes (64 KiB; h2's own default limit on a
/// decoded header list is 16 KiB, so every block h2 would accept fits).
pub const MAX_BLOCK: usize = 64 * 1024;
/// HPACK dynamic table size h2 advertises (`SETTINGS_HEADER_TABLE_SIZE`'s initial value,
/// RFC 9113 §6.5.2), bytes: a client's size update above it is an error.
const TABLE_SIZE: usize = 4_096;
/// What replaces an `:authority` h2 would refuse.
pub const REPLACEMENT: &str = "localhost";

/// Where the reader is in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before (or inside) the 24-byte preface.
    Preface,
    /// At the start of a frame.
    FrameHeader,
    /// Inside a frame that passes through: this many payload bytes remain.
    Passthrough(usize),
    /// Not HTTP/2 with prior knowledge, or a connection already refused: pass everything.
    Verbatim,
}

/// A header block being collected from `HEADERS` and `CONTINUATION` frames.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragments: BytesMut,
    /// The frames as the client sent them (headers included), for a block passed on as it is.
    original: BytesMut,
}

/// An accepted connection whose client header blocks reach h2 with a valid `:authority` (see
/// the module docs). Reads rewrite; writes pass through.
#[derive(Debug)]
pub struct AnyAuthority<S> {
    inner: S,
    /// Bytes read from the client, not yet looked at.
    raw: BytesMut,
    /// Bytes ready for h2.
    out: BytesMut,
    state: State,
    block: Option<Block>,
    decoder: Decoder,
    /// Whether this connection's header blocks are rewritten: decided by its first block.
    rewrite: bool,
    eof: bool,
}

/// `loona_hpack::Decoder` has no `Debug`.
struct Decoder(loona_hpack::Decoder<'static>);

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Decoder")
    }
}

impl<S> AnyAuthority<S> {
    /// Wraps an accepted connection.
    pub fn new(inner: S) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        AnyAuthority {
            inner,
            raw: BytesMut::new(),
            out: BytesMut::new(),
            state: State::Preface,
            block: None,
            decoder: Decoder(decoder),
            rewrite: false,
            eof: false,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Moves what can be moved from `raw` to `out`.
    ///
    /// # Errors
    /// `InvalidData` naming the refused frame (see the module docs); the connection ends.
    fn process(&mut self) -> io::Result<()> {
        loop {
            match self.state {
                State::Verbatim => {
                    let all = self.raw.split();
                    self.out.unsplit(all);
                    return Ok(());
                }
                State::Preface => {
                    let n = self.raw.len().min(PREFACE.len());
                    if self.raw[..n] != PREFACE[..n] {
                        self.state = State::Verbatim;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return Ok(());
                    }
                    let preface = self.raw.split_to(PREFACE.len());
                    self.out.unsplit(preface);
                    self.state = State::FrameHeader;
                }
                State::Passthrough(remaining) => {
                    let n = remaining.min(self.raw.len());
                    if n == 0 && remaining > 0 {
                        return Ok(());
                    }
                    let payload = self.raw.split_to(n);
                    self.out.unsplit(payload);
                    self.state = if remaining == n {
                        State::FrameHeader
                    } else {
                        State::Passthrough(remaining - n)
                    };
                }
                State::FrameHeader => {
                    if self.raw.len() < FRAME_HEADER {
                        return Ok(());
                    }
                    let h = &self.raw[..FRAME_HEADER];
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let kind = h[3];
                    let flags = h[4];
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    if kind != HEADERS && kind != CONTINUATION {
                        if self.block.is_some() {
                            return Err(refused("a frame inside a header block"));
                        }
                        let header = self.raw.split_to(FRAME_HEADER);
                        self.out.unsplit(header);
                        self.state = State::Passthrough(len);
                        continue;
                    }
                    if len > MAX_FRAME {
                        return Err(refused("a header frame over 16384 bytes"));
                    }
                    if self.raw.len() < FRAME_HEADER + len {
                        return Ok(());
                    }
                    let frame = self.raw.split_to(FRAME_HEADER + len);
                    self.header_frame(kind, flags, stream, &frame)?;
                }
            }
        }
    }

    /// One `HEADERS` or `CONTINUATION` frame (its 9-byte header included).
    fn header_frame(&mut self, kind: u8, flags: u8, stream: u32, frame: &[u8]) -> io::Result<()> {
        let payload = &frame[FRAME_HEADER..];
        let fragment = if kind == HEADERS {
            if self.block.is_some() {
                return Err(refused("HEADERS inside a header block"));
            }
            let mut p = payload;
            if flags & PADDED != 0 {
                let Some((&pad, rest)) = p.split_first() else {
                    return Err(refused("a padded HEADERS frame without its pad length"));
                };
                if usize::from(pad) > rest.len() {
                    return Err(refused("HEADERS padding longer than the frame"));
                }
                p = &rest[..rest.len() - usize::from(pad)];
            }
            let priority = if flags & PRIORITY != 0 {
                let Some((fields, rest)) = p.split_first_chunk::<5>() else {
                    return Err(refused("a HEADERS frame too short for its priority"));
                };
                p = rest;
                Some(*fields)
            } else {
                None
            };
            self.block = Some(Block {
                stream,
                end_stream: flags & END_STREAM != 0,
                priority,
                fragments: BytesMut::new(),
                original: BytesMut::new(),
            });
            p
        } else {
            match &self.block {
                Some(b) if b.stream == stream => payload,
                _ => return Err(refused("a CONTINUATION without its HEADERS")),
            }
        };
        let Some(block) = self.block.as_mut() else {
            return Err(refused("a CONTINUATION without its HEADERS"));
        };
        // Both the fragments and the frames as sent are bounded: a flood of empty
        // CONTINUATIONs adds nothing to the fragments but 9 bytes a frame to the original.
        if block.fragments.len() + fragment.len() > MAX_BLOCK
            || block.original.len() + frame.len() > 2 * MAX_BLOCK
        {
            return Err(refused("a header block over 64 KiB"));
        }
        block.fragments.extend_from_slice(fragment);
        block.original.extend_from_slice(frame);
        if flags & END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let (encoded, rewritten) = self.reencode(&block.fragments)?;
        if self.rewrite || rewritten {
            self.rewrite = true;
            write_frames(&mut self.out, &block, &encoded);
        } else {
            // The connection's first block needed nothing: every client sends one authority
            // per connection, so from here on the client's bytes pass as they are (h2's own
            // decoder keeps the client's dynamic table, and no decoding costs a request
            // anything; a later bad authority is refused by h2 as it would be without us).
            self.out.unsplit(block.original);
            self.state = State::Verbatim;
        }
        Ok(())
    }

    /// Decodes one whole header block and encodes it again with a valid `:authority`, every
    /// field a literal without indexing (RFC 7541 §6.2.2, no Huffman); true when the
    /// authority had to be replaced.
    fn reencode(&mut self, block: &[u8]) -> io::Result<(BytesMut, bool)> {
        // `loona-hpack` applies a size update wherever it stands; h2 refuses one after a field.
        if late_size_update(block) {
            return Err(refused(
                "HPACK: a dynamic table size update after a header field",
            ));
        }
        let mut encoded = BytesMut::with_capacity(block.len() + 16);
        let mut decoded = 0usize;
        let mut over = false;
        let mut replaced = false;
        let result = self.decoder.0.decode_with_cb(block, |name, value| {
            decoded += name.len() + value.len() + 32;
            if decoded > MAX_BLOCK {
                over = true;
                return;
            }
            let value = if name.as_ref() == b":authority"
                && http::uri::Authority::try_from(value.as_ref()).is_err()
            {
                replaced = true;
                Cow::Borrowed(REPLACEMENT.as_bytes())
            } else {
                value
            };
            encoded.put_u8(0);
            put_string(&mut encoded, &name);
            put_string(&mut encoded, &value);
        });
        if let Err(e) = result {
            return Err(refused(&format!("HPACK: {e}")));
        }
        if over {
            return Err(refused("a header block decoding to over 64 KiB"));
        }
        Ok((encoded, replaced))
    }
}

/// What h2 reads for `input`, the bytes a client sent, delivered `chunk` bytes per read (at
/// least 1): the rewrite without a socket, for the fuzz target and tests.
///
/// # Errors
/// As a connection would end (`InvalidData`, see the module docs).
pub fn rewrite(input: &[u8], chunk: usize) -> io::Result<Vec<u8>> {
    let mut shim = AnyAuthority::new(());
    for piece in input.chunks(chunk.max(1)) {
        shim.raw.extend_from_slice(piece);
        shim.process()?;
    }
    Ok(shim.out.to_vec())
}

/// Whether a dynamic table size update (RFC 7541 §6.3) in `block` follows a header field
/// representation: §4.2 allows size updates only at the beginning of a header block, and one
/// anywhere else is a decoding error (h2 answers `COMPRESSION_ERROR`), which `loona-hpack` does
/// not check. Reads only the representations' integers and string lengths; a block that ends
/// inside one answers false and is left to the decoder, which refuses it.
fn late_size_update(block: &[u8]) -> bool {
    let mut rest = block;
    let mut field_seen = false;
    while let Some(&first) = rest.first() {
        // The representation's integer prefix (RFC 7541 §6), and whether strings follow it.
        let (prefix, literal) = if first & 0x80 != 0 {
            (7, false) // indexed field
        } else if first & 0x40 != 0 {
            (6, true) // literal with incremental indexing
        } else if first & 0x20 != 0 {
            if field_seen {
                return true;
            }
            (5, false) // size update
        } else {
            (4, true) // literal without indexing, or never indexed
        };
        let Some((index, n)) = read_integer(rest, prefix) else {
            return false;
        };
        rest = &rest[n..];
        if literal {
            // Name index 0: a new name, a string before the value's.
            for _ in 0..if index == 0 { 2 } else { 1 } {
                let Some((len, n)) = read_integer(rest, 7) else {
                    return false;
                };
                let Some(after) = n.checked_add(len).and_then(|end| rest.get(end..)) else {
                    return false;
                };
                rest = after;
            }
        }
        field_seen |= prefix != 5;
    }
    false
}

/// The HPACK integer with a `prefix`-bit prefix at the start of `buf` (RFC 7541 §5.1) and the
/// bytes it takes; `None` when `buf` ends inside it or it takes more than 5 bytes (which
/// `loona-hpack` refuses).
fn read_integer(buf: &[u8], prefix: u8) -> Option<(usize, usize)> {
    let max = (1usize << prefix) - 1;
    let value = usize::from(*buf.first()?) & max;
    if value < max {
        return Some((value, 1));
    }
    let mut value = max;
    for (i, &b) in buf.iter().enumerate().skip(1).take(4) {
        value += usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// An HPACK string literal without Huffman coding (RFC 7541 §5.2).
fn put_string(dst: &mut BytesMut, s: &[u8]) {
    put_integer(dst, s.len(), 7, 0);
    dst.extend_from_slice(s);
}

/// An HPACK integer with an `prefix`-bit prefix (RFC 7541 §5.1).
fn put_integer(dst: &mut BytesMut, mut value: usize, prefix: u8, high_bits: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        // `value < max < 256`: the cast keeps every bit.
        dst.put_u8(high_bits | value as u8);
        return;
    }
    dst.put_u8(high_bits | max as u8);
    value -= max;
    while value >= 128 {
        dst.put_u8((value % 128) as u8 | 0x80);
        value /= 128;
    }
    dst.put_u8(value as u8);
}

/// The block as one `HEADERS` frame and as many `CONTINUATION` frames as [`MAX_FRAME`] needs.
fn write_frames(out: &mut BytesMut, block: &Block, encoded: &[u8]) {
    let priority_len = if block.priority.is_some() { 5 } else { 0 };
    let first = encoded.len().min(MAX_FRAME - priority_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= END_STREAM;
    }
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if first == encoded.len() {
        flags |= END_HEADERS;
    }
    put_frame_header(out, first + priority_len, HEADERS, flags, block.stream);
    if let Some(p) = block.priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(&encoded[..first]);
    let mut rest = &encoded[first..];
    while !rest.is_empty() {
        let n = rest.len().min(MAX_FRAME);
        let flags = if n == rest.len() { END_HEADERS } else { 0 };
        put_frame_header(out, n, CONTINUATION, flags, block.stream);
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
}

fn put_frame_header(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    // `len <= MAX_FRAME < 2^24`: three bytes hold it.
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.put_u32(stream);
}

fn refused(what: &str) -> io::Error {
    tracing::debug!(reason = what, "gRPC connection refused");
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 connection refused: {what}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for AnyAuthority<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.out.is_empty() {
                let n = buf.remaining().min(this.out.len());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // A frame cut short passes as it is: h2 sees the end mid-frame and refuses it.
                let rest = this.raw.split();
                this.out.unsplit(rest);
                if this.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if this.raw.capacity() - this.raw.len() < 4096 {
                this.raw.reserve(MAX_FRAME);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.raw) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => this.eof = true,
                Poll::Ready(Ok(_)) => {
                    if let Err(e) = this.process() {
                        this.state = State::Verbatim;
                        this.raw.clear();
                        this.out.clear();
                        return Poll::Ready(Err(e));
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AnyAuthority<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AnyAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
