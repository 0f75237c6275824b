//! A TCP forwarder to the API server on the root namespace's loopback, listening on
//! loopback too, either in the root namespace or inside a lab namespace (a node's
//! `127.0.0.1:6443`). Tests also use it to disturb clients the way a network does:
//! [`Forwarder::cut`] closes every open connection (watches end mid-stream) and
//! [`Forwarder::hold`] turns new connections away until [`Forwarder::release`].
//!
//! It runs on its own thread and runtime, so it serves synchronous tests, tokio tests
//! and the kubelet stand-in alike, and stops when dropped.

use std::{
    net::{Ipv4Addr, SocketAddrV4, TcpListener},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use anyhow::{Context, Result};
use tokio::sync::watch;

use crate::netns;

/// A running forwarder; stops (and closes its connections) when dropped.
pub struct Forwarder {
    addr: SocketAddrV4,
    /// Bumped by `cut`: every connection open at that moment is closed.
    generation: watch::Sender<u64>,
    holding: Arc<AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Forwarder {
    /// Listens on `127.0.0.1:port` (0 for any free port) in the network namespace
    /// `netns` (`None`: this process's own) and forwards every connection to
    /// `127.0.0.1:target` in the root namespace.
    pub fn start(netns: Option<&str>, port: u16, target: u16) -> Result<Self> {
        let bind = move || -> std::io::Result<TcpListener> {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
            l.set_nonblocking(true)?;
            Ok(l)
        };
        let listener = match netns {
            Some(ns) => netns::in_netns(ns, bind)?,
            None => bind(),
        }
        .with_context(|| format!("listening on 127.0.0.1:{port} in {netns:?}"))?;
        let addr = match listener.local_addr()? {
            std::net::SocketAddr::V4(a) => a,
            other => anyhow::bail!("unexpected address {other}"),
        };
        let (generation, cuts) = watch::channel(0u64);
        let holding = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let hold = holding.clone();
        std::thread::Builder::new()
            .name(format!("forward-{port}"))
            .spawn(move || {
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("a non-blocking listener");
                    let serve = async {
                        loop {
                            let Ok((inbound, _)) = listener.accept().await else {
                                continue;
                            };
                            // The generation first: a `hold` after this check bumps
                            // it after, so the connection is still closed.
                            let generation = *cuts.borrow();
                            if hold.load(Ordering::SeqCst) {
                                // Turned away: the client sees its connection closed.
                                drop(inbound);
                                continue;
                            }
                            tokio::spawn(pipe(inbound, target, cuts.clone(), generation));
                        }
                    };
                    tokio::select! {
                        _ = serve => {}
                        _ = stopped => {}
                    }
                })
            })?;
        Ok(Self {
            addr,
            generation,
            holding,
            stop: Some(stop),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    /// Closes every connection open now; new ones are forwarded as before.
    pub fn cut(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Closes every connection open now and turns new ones away until
    /// [`release`](Self::release): the API server is unreachable meanwhile.
    pub fn hold(&self) {
        self.holding.store(true, Ordering::SeqCst);
        self.cut();
    }

    /// Forwards new connections again.
    pub fn release(&self) {
        self.holding.store(false, Ordering::SeqCst);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.cut();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn pipe(
    mut inbound: tokio::net::TcpStream,
    target: u16,
    mut cuts: watch::Receiver<u64>,
    generation: u64,
) {
    let Ok(mut outbound) = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, target)).await
    else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cuts.wait_for(|g| *g != generation) => {}
    }
    // Both sides are closed on drop.
}
