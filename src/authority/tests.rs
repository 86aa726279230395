//! The rewrite on bytes: client frames in, what h2 would read out.

use super::*;

/// A literal field with incremental indexing and a new name (RFC 7541 §6.2.1).
fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_u8(0x40);
    put_string(&mut b, name);
    put_string(&mut b, value);
    b.to_vec()
}

/// A literal field without indexing and a new name (RFC 7541 §6.2.2).
fn literal(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_u8(0);
    put_string(&mut b, name);
    put_string(&mut b, value);
    b.to_vec()
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    put_frame_header(&mut b, payload.len(), kind, flags, stream);
    b.extend_from_slice(payload);
    b.to_vec()
}

fn request_block(authority: &[u8]) -> Vec<u8> {
    [
        literal(b":method", b"POST"),
        literal(b":scheme", b"http"),
        literal(b":path", b"/v1beta1.DevicePlugin/Allocate"),
        literal(b":authority", authority),
        literal(b"content-type", b"application/grpc"),
        literal(b"te", b"trailers"),
    ]
    .concat()
}

/// Feeds `input` one byte at a time (every read boundary) and returns what h2 would read.
fn run_bytewise(input: &[u8]) -> io::Result<Vec<u8>> {
    rewrite(input, 1)
}

fn run(input: &[u8]) -> io::Result<Vec<u8>> {
    rewrite(input, input.len())
}

/// Splits h2's input into frames (after the preface) and decodes every header block with a
/// decoder of its own, as h2 does.
fn frames_seen_by_h2(out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    assert_eq!(&out[..PREFACE.len()], PREFACE);
    let mut rest = &out[PREFACE.len()..];
    let mut frames = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        frames.push((rest[3], rest[4], stream, rest[9..9 + len].to_vec()));
        rest = &rest[9 + len..];
    }
    frames
}

fn decode(decoder: &mut loona_hpack::Decoder<'static>, block: &[u8]) -> Vec<(String, String)> {
    decoder
        .decode(block)
        .unwrap()
        .into_iter()
        .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
        .collect()
}

fn authority_of(headers: &[(String, String)]) -> Option<&str> {
    headers
        .iter()
        .find(|(n, _)| n == ":authority")
        .map(|(_, v)| v.as_str())
}

#[test]
fn path_authorities_become_localhost_and_valid_ones_stay() {
    let cases: [(&str, &[u8], &str); 5] = [
        // grpc-go before 1.5x, as kubelet 1.32's plugin watcher sends it.
        (
            "plain path",
            b"/var/lib/kubelet/plugins_registry/gpu.slicelet.io-reg.sock",
            "localhost",
        ),
        // grpc-go of kubelet 1.36, grpc C-core.
        (
            "percent-encoded",
            b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.slicelet.io-reg.sock",
            "localhost",
        ),
        ("empty", b"", "localhost"),
        ("localhost", b"localhost", "localhost"),
        ("host and port", b"127.0.0.1:8080", "127.0.0.1:8080"),
    ];
    for (case, authority, want) in cases {
        let input = [
            PREFACE.to_vec(),
            frame(HEADERS, END_HEADERS, 1, &request_block(authority)),
        ]
        .concat();
        for out in [run(&input).unwrap(), run_bytewise(&input).unwrap()] {
            let frames = frames_seen_by_h2(&out);
            assert_eq!(frames.len(), 1, "{case}");
            let (kind, flags, stream, block) = &frames[0];
            assert_eq!(
                (*kind, *flags, *stream),
                (HEADERS, END_HEADERS, 1),
                "{case}"
            );
            let headers = decode(&mut loona_hpack::Decoder::new(), block);
            assert_eq!(authority_of(&headers), Some(want), "{case}");
            // Every other field unchanged and in order.
            let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                [
                    ":method",
                    ":scheme",
                    ":path",
                    ":authority",
                    "content-type",
                    "te"
                ],
                "{case}"
            );
            assert_eq!(headers[2].1, "/v1beta1.DevicePlugin/Allocate", "{case}");
        }
    }
}

/// A connection whose first block carries a valid authority passes byte for byte from there
/// on, later blocks included (a bad authority on a later stream is h2's to refuse, as it
/// would be without the rewrite).
#[test]
fn a_valid_first_authority_lets_the_connection_pass_as_sent() {
    let first = frame(HEADERS, END_HEADERS, 1, &request_block(b"localhost"));
    let second = frame(HEADERS, END_HEADERS, 3, &request_block(b"/x.sock"));
    let data = frame(0x0, END_STREAM, 3, &[0; 5]);
    let input = [PREFACE.to_vec(), first, second, data].concat();
    assert_eq!(run(&input).unwrap(), input);
    assert_eq!(run_bytewise(&input).unwrap(), input);
}

#[test]
fn non_header_frames_pass_byte_for_byte() {
    let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
    let data = frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 3, 1, 2, 3]);
    let empty = frame(0x0, 0, 3, &[]);
    let ping = frame(0x6, 0, 0, &[7; 8]);
    let input = [PREFACE.to_vec(), settings, data, empty, ping].concat();
    assert_eq!(run(&input).unwrap(), input);
    assert_eq!(run_bytewise(&input).unwrap(), input);
}

#[test]
fn the_clients_dynamic_table_is_resolved_for_h2() {
    // Block 1 indexes the authority (dynamic index 62); block 2 refers to it by index only.
    let first = [
        literal(b":method", b"POST"),
        literal(b":path", b"/a"),
        indexed_literal(b":authority", b"/run/x.sock"),
        indexed_literal(b"x-kept", b"kept value"),
    ]
    .concat();
    let second = [literal(b":path", b"/b"), vec![0x80 | 63], vec![0x80 | 62]].concat();
    let input = [
        PREFACE.to_vec(),
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(HEADERS, END_HEADERS | END_STREAM, 3, &second),
    ]
    .concat();
    let out = run_bytewise(&input).unwrap();
    let frames = frames_seen_by_h2(&out);
    // One decoder for the connection, as h2 keeps one: nothing it reads needs its table.
    let mut h2 = loona_hpack::Decoder::new();
    let one = decode(&mut h2, &frames[0].3);
    let two = decode(&mut h2, &frames[1].3);
    assert_eq!(authority_of(&one), Some("localhost"));
    assert_eq!(authority_of(&two), Some("localhost"));
    assert!(two.contains(&("x-kept".to_string(), "kept value".to_string())));
    assert_eq!(frames[1].1, END_HEADERS | END_STREAM);
}

#[test]
fn continuation_padding_and_priority_are_folded() {
    let block = request_block(b"/a/path.sock");
    let (a, b) = block.split_at(10);
    // HEADERS padded (3 bytes) with priority fields, then one CONTINUATION.
    let mut headers = vec![3u8];
    headers.extend_from_slice(&[0, 0, 0, 0, 16]);
    headers.extend_from_slice(a);
    headers.extend_from_slice(&[0, 0, 0]);
    let input = [
        PREFACE.to_vec(),
        frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &headers),
        frame(CONTINUATION, END_HEADERS, 5, b),
    ]
    .concat();
    let out = run_bytewise(&input).unwrap();
    let frames = frames_seen_by_h2(&out);
    assert_eq!(frames.len(), 1);
    let (kind, flags, stream, payload) = &frames[0];
    assert_eq!(
        (*kind, *flags, *stream),
        (HEADERS, PRIORITY | END_STREAM | END_HEADERS, 5)
    );
    assert_eq!(&payload[..5], &[0, 0, 0, 0, 16]);
    let headers = decode(&mut loona_hpack::Decoder::new(), &payload[5..]);
    assert_eq!(authority_of(&headers), Some("localhost"));
}

#[test]
fn a_block_over_one_frame_is_written_as_continuations() {
    // Indexed references expand: 4 KiB of value referred to 5 times re-encodes to > 16 KiB.
    let big = vec![b'v'; 3_000];
    let mut block = [
        literal(b":path", b"/p"),
        literal(b":authority", b"/s.sock"),
        indexed_literal(b"x-big", &big),
    ]
    .concat();
    block.extend(std::iter::repeat_n(0x80 | 62, 5));
    let input = [PREFACE.to_vec(), frame(HEADERS, END_HEADERS, 1, &block)].concat();
    let out = run(&input).unwrap();
    let frames = frames_seen_by_h2(&out);
    assert_eq!(frames.len(), 2);
    assert_eq!((frames[0].0, frames[0].1), (HEADERS, 0));
    assert_eq!(frames[0].3.len(), MAX_FRAME);
    assert_eq!((frames[1].0, frames[1].1), (CONTINUATION, END_HEADERS));
    let whole = [frames[0].3.clone(), frames[1].3.clone()].concat();
    let headers = decode(&mut loona_hpack::Decoder::new(), &whole);
    assert_eq!(headers.len(), 8);
    assert_eq!(authority_of(&headers), Some("localhost"));
}

#[test]
fn hostile_frames_end_the_connection() {
    let block = request_block(b"/s.sock");
    let over_table = {
        // Dynamic table size update to 1 MiB (RFC 7541 §6.3): above the 4,096 h2 allows.
        let mut b = BytesMut::new();
        put_integer(&mut b, 1 << 20, 5, 0x20);
        [b.to_vec(), block.clone()].concat()
    };
    // 17 references to a 4 KiB entry: a 4 KiB block that decodes to 68 KiB.
    let bomb = {
        let mut b = indexed_literal(b"x", &[b'a'; 4_000]);
        b.extend(std::iter::repeat_n(0x80 | 62, 17));
        b
    };
    let cases: [(&str, Vec<u8>); 8] = [
        (
            "frame inside a block",
            [frame(HEADERS, 0, 1, &block[..4]), frame(0x0, 0, 1, b"x")].concat(),
        ),
        (
            "continuation without headers",
            frame(CONTINUATION, END_HEADERS, 1, &block),
        ),
        (
            "continuation of another stream",
            [
                frame(HEADERS, 0, 1, &block[..4]),
                frame(CONTINUATION, END_HEADERS, 3, &block[4..]),
            ]
            .concat(),
        ),
        (
            "header frame over 16 KiB",
            frame(HEADERS, END_HEADERS, 1, &vec![0; MAX_FRAME + 1]),
        ),
        (
            "padding past the end",
            frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 0]),
        ),
        (
            "table size over 4096",
            frame(HEADERS, END_HEADERS, 1, &over_table),
        ),
        (
            "decodes to over 64 KiB",
            frame(HEADERS, END_HEADERS, 1, &bomb),
        ),
        (
            "not HPACK",
            frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff]),
        ),
    ];
    for (case, frames) in cases {
        let input = [PREFACE.to_vec(), frames].concat();
        let err = run(&input).expect_err(case);
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{case}");
    }
    // A block growing past 64 KiB over CONTINUATIONs.
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, 0, 1, &vec![0; MAX_FRAME]));
    for _ in 0..4 {
        input.extend(frame(CONTINUATION, 0, 1, &vec![0; MAX_FRAME]));
    }
    assert!(run(&input).is_err());
    // A flood of empty CONTINUATIONs (nothing for the fragments, 9 bytes a frame to keep).
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, 0, 1, &block[..4]));
    for _ in 0..(2 * MAX_BLOCK / FRAME_HEADER + 1) {
        input.extend(frame(CONTINUATION, 0, 1, &[]));
    }
    assert!(run(&input).is_err());
}

/// A dynamic table size update after a header field (RFC 7541 §4.2: only at the beginning of
/// a block) is a decoding error, refused as h2 refuses it on a connection that passes: in the
/// block that decides the rewrite, and in a later block of a rewritten connection.
#[test]
fn a_size_update_after_a_field_ends_the_connection() {
    // Size update to 0 (RFC 7541 §6.3) after `:method`, before the rest of the request.
    let late = |authority: &[u8]| {
        let block = request_block(authority);
        let method = literal(b":method", b"POST").len();
        [&block[..method], &[0x20], &block[method..]].concat()
    };
    let cases: [(&str, Vec<u8>); 3] = [
        (
            "first block, rewritten",
            frame(HEADERS, END_HEADERS, 1, &late(b"/s.sock")),
        ),
        (
            "later block of a rewritten connection",
            [
                frame(HEADERS, END_HEADERS, 1, &request_block(b"/s.sock")),
                frame(HEADERS, END_HEADERS, 3, &late(b"/s.sock")),
            ]
            .concat(),
        ),
        (
            "first block, valid authority",
            frame(HEADERS, END_HEADERS, 1, &late(b"localhost")),
        ),
    ];
    for (case, frames) in cases {
        let input = [PREFACE.to_vec(), frames].concat();
        for result in [run(&input), run_bytewise(&input)] {
            let err = result.expect_err(case);
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{case}");
        }
    }
}

/// Size updates at the beginning of a block, one or two (RFC 7541 §4.2), in the first block
/// and in a later one: accepted, and the rewrite is as without them.
#[test]
fn size_updates_at_the_beginning_of_a_block_are_accepted() {
    let mut updates = BytesMut::new();
    put_integer(&mut updates, 0, 5, 0x20);
    put_integer(&mut updates, TABLE_SIZE, 5, 0x20);
    let first = [updates.to_vec(), request_block(b"/s.sock")].concat();
    let second = [vec![0x20 | 10], request_block(b"/s.sock")].concat();
    let input = [
        PREFACE.to_vec(),
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(HEADERS, END_HEADERS, 3, &second),
    ]
    .concat();
    let plain = [
        PREFACE.to_vec(),
        frame(HEADERS, END_HEADERS, 1, &request_block(b"/s.sock")),
        frame(HEADERS, END_HEADERS, 3, &request_block(b"/s.sock")),
    ]
    .concat();
    let want = run(&plain).unwrap();
    assert_eq!(run(&input).unwrap(), want);
    assert_eq!(run_bytewise(&input).unwrap(), want);
}

#[test]
fn without_the_preface_everything_passes_untouched() {
    let input = b"GET / HTTP/1.1\r\nHost: /x.sock\r\n\r\n".to_vec();
    assert_eq!(run(&input).unwrap(), input);
    assert_eq!(run_bytewise(&input).unwrap(), input);
}

#[test]
fn integers_encode_as_rfc_7541_appendix_c1() {
    // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix.
    let mut b = BytesMut::new();
    put_integer(&mut b, 10, 5, 0);
    put_integer(&mut b, 1337, 5, 0);
    put_integer(&mut b, 127, 7, 0);
    assert_eq!(&b[..], &[10, 31, 154, 10, 127, 0]);
}

#[tokio::test]
async fn reads_through_the_wrapper_match_the_rewrite() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let input = [
        PREFACE.to_vec(),
        frame(HEADERS, END_HEADERS, 1, &request_block(b"/x.sock")),
        frame(0x0, END_STREAM, 1, &[0; 5]),
    ]
    .concat();
    let want = run(&input).unwrap();
    let (mut client, server) = tokio::io::duplex(7);
    let writer = tokio::spawn(async move {
        client.write_all(&input).await.unwrap();
        client.shutdown().await.unwrap();
    });
    let mut got = Vec::new();
    AnyAuthority::new(server)
        .read_to_end(&mut got)
        .await
        .unwrap();
    writer.await.unwrap();
    assert_eq!(got, want);
}

mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any bytes: no panic, and the read boundaries never change the answer.
        #[test]
        fn any_bytes_read_in_any_pieces_agree(data in proptest::collection::vec(any::<u8>(), 0..512), chunk in 1usize..64) {
            let input = [PREFACE.to_vec(), data].concat();
            let whole = rewrite(&input, input.len());
            let pieces = rewrite(&input, chunk);
            prop_assert_eq!(whole.is_ok(), pieces.is_ok());
            if let (Ok(a), Ok(b)) = (whole, pieces) {
                prop_assert_eq!(a, b);
            }
        }

        /// Requests with any authority bytes, split over CONTINUATIONs anywhere: h2 gets the
        /// same fields, the authority kept when valid and `localhost` otherwise.
        #[test]
        fn any_authority_reaches_h2_valid(authority in proptest::collection::vec(any::<u8>(), 0..40), split in 0usize..200, chunk in 1usize..32) {
            let block = request_block(&authority);
            let split = split.min(block.len());
            let input = [
                PREFACE.to_vec(),
                frame(HEADERS, 0, 1, &block[..split]),
                frame(CONTINUATION, END_HEADERS, 1, &block[split..]),
            ]
            .concat();
            let out = rewrite(&input, chunk).unwrap();
            // One block: rewritten into one HEADERS, or passed as sent (HEADERS, CONTINUATION).
            let block: Vec<u8> = frames_seen_by_h2(&out).into_iter().flat_map(|f| f.3).collect();
            let got = loona_hpack::Decoder::new().decode(&block).unwrap();
            let want_authority = if http::uri::Authority::try_from(authority.as_slice()).is_ok() {
                authority.clone()
            } else {
                REPLACEMENT.as_bytes().to_vec()
            };
            let want: Vec<(Vec<u8>, Vec<u8>)> = loona_hpack::Decoder::new()
                .decode(&block)
                .unwrap()
                .into_iter()
                .map(|(n, v)| if n == b":authority" { (n, want_authority.clone()) } else { (n, v) })
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
