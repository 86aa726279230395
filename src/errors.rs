//! Helpers for error values shared by the modules (each module has its own `thiserror` enum).

/// The error and its sources on one line, `outer: inner: innermost`, skipping a source whose
/// text the message before it already contains (some library errors print their source
/// inline). For log lines and `/readyz` reasons, where only one string fits.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

/// `text` for a log line, an error or a `/readyz` reason: whole up to `max_chars` characters,
/// otherwise its first `max_chars` followed by `… (N bytes in all)`. Parsers (serde, YAML)
/// quote a bad scalar whole, and a 4 MiB scalar must not become a 4 MiB log line or `/readyz`
/// body, nor a whole file read by mistake (a symlink to `/etc/passwd`) reach the log.
pub fn shorten(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} bytes in all)", &text[..cut], text.len()))
        }
        None => std::borrow::Cow::Borrowed(text),
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("reading /etc/x")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn sources_are_joined_once() {
        let e = Outer(std::io::Error::other("permission denied"));
        assert_eq!(super::chain(&e), "reading /etc/x: permission denied");
        let inline = std::io::Error::other("a: b");
        assert_eq!(super::chain(&inline), "a: b");
    }
}
