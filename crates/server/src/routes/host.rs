//! The `Host` check that keeps web pages from reaching a local server without an API key
//! (DNS rebinding): a browser tricked into sending a request to 127.0.0.1 still sends the
//! attacker's host name, which is refused.

use std::net::IpAddr;

/// True when `host` (a `Host` header: a name or address, with or without a port) names this
/// server: localhost, a loopback address, `local` (the address the connection arrived on)
/// or one of `allowed`.
pub fn is_allowed(host: &str, local: Option<IpAddr>, allowed: &[String]) -> bool {
    let Some(name) = without_port(host.trim()) else {
        return false;
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name)) {
        return true;
    }
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || local.is_some_and(|l| l.to_canonical() == ip.to_canonical()),
        Err(_) => false,
    }
}

/// The name part of `host[:port]` or `[v6][:port]`; `None` when the port is not a number.
fn without_port(host: &str) -> Option<&str> {
    if host.starts_with('[') {
        let end = host.find(']')?;
        let rest = &host[end + 1..];
        let port_ok = rest.is_empty()
            || rest
                .strip_prefix(':')
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        return port_ok.then_some(&host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => {
            (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())).then_some(name)
        }
        _ => Some(host),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_names_pass_and_others_do_not() {
        let local: Option<IpAddr> = Some("192.168.1.7".parse().unwrap());
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:8080",
            "192.168.1.7:8080",
            "my.box:80",
        ] {
            assert!(is_allowed(host, local, &["my.box".into()]), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "192.168.1.8",
            "localhost:80x",
            "[::1]x",
            "",
        ] {
            assert!(!is_allowed(host, local, &[]), "{host}");
        }
    }
}
