//! Port reservation before shards bind. Shards bind with SO_REUSEPORT so
//! the kernel spreads connections over them, but that would also let a
//! second server bind the same port silently: a fixed port is probed first
//! without SO_REUSEPORT, so a port in use is a start-up error.
//!
//! With `--reuse-http-port` / `--reuse-grpc-port` (Triton's meaning:
//! servers that all set it may listen on the same port, the kernel
//! spreading connections over them) a fixed port is held like an
//! ephemeral one: by a placeholder with SO_REUSEPORT, which binds only if
//! whoever holds the port set SO_REUSEPORT too (and runs as the same
//! user), so a port held by a server without the flag is still an error.
//!
//! Port 0 (tests, tools) is resolved by binding a placeholder socket with
//! SO_REUSEPORT and holding it until every shard has bound the same port:
//! releasing a probe first would leave a window in which another server
//! starting in parallel could be given the same port, and the two would
//! then share it. The placeholder never listens, so the kernel routes no
//! connection to it.

use std::net::{SocketAddr, TcpListener};

use anyhow::Context;
use socket2::{Domain, Protocol, Socket, Type};

/// A reserved address; keep it alive until the shards' listeners exist.
pub struct Reserved {
    pub addr: SocketAddr,
    _placeholder: Option<Socket>,
}

/// Reserves `addr` for the `what` listener; `reuse`: the port may be
/// shared with other processes that set SO_REUSEPORT too.
pub fn reserve(what: &str, addr: SocketAddr, reuse: bool) -> anyhow::Result<Reserved> {
    if addr.port() == 0 || reuse {
        return hold_shared(what, addr);
    }
    let probe = TcpListener::bind(addr).with_context(|| {
        let hint = match what {
            "HTTP" => " (servers share a port only when each sets --reuse-http-port)",
            "gRPC" => " (servers share a port only when each sets --reuse-grpc-port)",
            _ => "",
        };
        format!("cannot bind the {what} port {addr}: is another server using it?{hint}")
    })?;
    let bound = probe
        .local_addr()
        .with_context(|| format!("cannot read the {what} address"))?;
    drop(probe);
    Ok(Reserved {
        addr: bound,
        _placeholder: None,
    })
}

fn hold_shared(what: &str, addr: SocketAddr) -> anyhow::Result<Reserved> {
    let context = || {
        if addr.port() == 0 {
            format!("cannot reserve an ephemeral {what} port on {}", addr.ip())
        } else {
            format!(
                "cannot bind the {what} port {addr} with SO_REUSEPORT: it is held by a \
                 process that did not set it (or runs as another user)"
            )
        }
    };
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .with_context(context)?;
    socket.set_reuse_port(true).with_context(context)?;
    socket.bind(&addr.into()).with_context(context)?;
    let bound = socket
        .local_addr()
        .with_context(context)?
        .as_socket()
        .with_context(context)?;
    Ok(Reserved {
        addr: bound,
        _placeholder: Some(socket),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ephemeral_port_stays_taken_while_reserved() {
        let r = reserve("test", "127.0.0.1:0".parse().unwrap(), false).unwrap();
        assert_ne!(r.addr.port(), 0);
        // A plain bind (no SO_REUSEPORT) of the same port fails meanwhile.
        assert!(TcpListener::bind(r.addr).is_err());
    }

    #[test]
    fn a_fixed_port_in_use_is_refused() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = reserve("HTTP", taken.local_addr().unwrap(), false)
            .err()
            .unwrap();
        assert!(
            format!("{e:#}").contains("is another server using it"),
            "{e:#}"
        );
        // Sharing needs SO_REUSEPORT on both sides: the plain holder refuses.
        let e = reserve("HTTP", taken.local_addr().unwrap(), true)
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("SO_REUSEPORT"), "{e:#}");
    }

    #[test]
    fn a_reused_port_is_shared_with_another_reuser() {
        let first = reserve("HTTP", "127.0.0.1:0".parse().unwrap(), true).unwrap();
        let second = reserve("HTTP", first.addr, true).unwrap();
        assert_eq!(second.addr, first.addr);
        assert!(reserve("HTTP", first.addr, false).is_err());
    }
}
