//! The `:authority` rewrite on arbitrary client bytes (a preface is put first, so the frame
//! reader runs). It may not panic; read in one piece or byte by byte it gives the same answer;
//! and the first header block it passes on decodes, with an `:authority` h2 accepts (later
//! ones pass as sent when the first needed nothing).
#![no_main]

use libfuzzer_sys::fuzz_target;
use slicelet::authority::rewrite;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fuzz_target!(|data: &[u8]| {
    let input = [PREFACE, data].concat();
    let whole = rewrite(&input, input.len());
    let bytewise = rewrite(&input, 1);
    assert_eq!(whole.is_ok(), bytewise.is_ok());
    let Ok(out) = whole else {
        return;
    };
    assert_eq!(out, bytewise.unwrap());
    let mut decoder = loona_hpack::Decoder::new();
    decoder.set_max_allowed_table_size(4096);
    let mut rest = &out[PREFACE.len()..];
    let mut block = Vec::new();
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let Some(payload) = rest.get(9..9 + len) else {
            break;
        };
        let (kind, flags) = (rest[3], rest[4]);
        if kind == 0x1 || kind == 0x9 {
            // HEADERS: padding and priority fields as flagged.
            let mut p = payload;
            if kind == 0x1 && flags & 0x8 != 0 {
                let pad = usize::from(p[0]);
                p = &p[1..p.len() - pad];
            }
            if kind == 0x1 && flags & 0x20 != 0 {
                p = &p[5..];
            }
            block.extend_from_slice(p);
            if flags & 0x4 != 0 {
                for (name, value) in decoder.decode(&block).expect("a block it wrote decodes") {
                    if name == b":authority" {
                        assert!(http::uri::Authority::try_from(value.as_slice()).is_ok());
                    }
                }
                return;
            }
        }
        rest = &rest[9 + len..];
    }
});
