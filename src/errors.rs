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
