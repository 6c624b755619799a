//! Port reservation before shards bind. Shards bind with SO_REUSEPORT so
//! the kernel spreads connections over them, but that would also let a
//! second server bind the same port silently: probe first without it.

use std::net::{SocketAddr, TcpListener};

use anyhow::Context;

/// Checks that `addr` is free (a port already in use is a start-up error)
/// and resolves port 0 to a concrete free port all shards then share.
pub fn reserve(what: &str, addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let probe = TcpListener::bind(addr).with_context(|| {
        format!("cannot bind the {what} port {addr}: is another server using it?")
    })?;
    let bound = probe
        .local_addr()
        .with_context(|| format!("cannot read the {what} address"))?;
    drop(probe);
    Ok(bound)
}
