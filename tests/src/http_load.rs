//! A steady HTTP load on a Service from inside a pod's network namespace, split into
//! named phases: new connections one after the other, each a `GET` and its answer,
//! and connections kept open that ask again and again (HTTP/1.1 keep-alive). Every
//! request is recorded with the time it started and whether it was answered, by
//! one of the expected pods, so a test can say how many failed in each phase and
//! for how long.

use std::{
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    os::fd::AsRawFd,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

/// How long a connect or an answer may take before the request counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Which of the load's streams a request belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// A new connection for each request.
    New,
    /// The `n`th connection kept open (opened again after a failure).
    Open(usize),
}

/// One request.
#[derive(Clone, Debug)]
pub struct Request {
    pub client: String,
    pub stream: Stream,
    pub started: Instant,
    /// `None` when answered by one of the expected pods, else what went wrong.
    pub error: Option<String>,
    /// For [`Stream::Open`]: the connection was opened for this request (the first
    /// one, or after a failure).
    pub reopened: bool,
}

/// Figures of one phase.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub new: usize,
    pub new_failed: usize,
    /// The longest time from a failed new connection's start to the start of the
    /// next answered one, of any client.
    pub new_outage: Duration,
    /// The most new connections of one client that failed one after the other, the
    /// run counted in the phase where it began.
    pub new_failed_in_a_row: usize,
    pub open: usize,
    pub open_failed: usize,
}

/// The load: threads of every client, until [`Load::stop`].
pub struct Load {
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Request>>>,
    phases: Vec<(String, Instant)>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    /// An empty load; add clients with [`Load::client`], then [`Load::phase`].
    pub fn new() -> Self {
        Self {
            stop: Arc::new(AtomicBool::new(false)),
            requests: Arc::default(),
            phases: Vec::new(),
            threads: Vec::new(),
        }
    }

    /// Starts a client in the network namespace `netns` (a path, such as
    /// `/proc/PID/ns/net`) sending `GET /hostname` to `to`: a new connection every
    /// `every`, and `open` connections kept open that ask every `every * 4`. An
    /// answer must be one of `pods`.
    pub fn client(
        &mut self,
        name: &str,
        netns: &Path,
        to: SocketAddr,
        every: Duration,
        open: usize,
        pods: &[String],
    ) -> Result<()> {
        for stream in std::iter::once(Stream::New).chain((0..open).map(Stream::Open)) {
            let ns = File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
            let (stop, requests) = (self.stop.clone(), self.requests.clone());
            let (name, pods) = (name.to_string(), pods.to_vec());
            let pause = match stream {
                Stream::New => every,
                Stream::Open(_) => every * 4,
            };
            self.threads.push(std::thread::spawn(move || {
                // SAFETY: setns on a namespace file opened above; it changes only this
                // thread's network namespace.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    panic!("setns for {name}: {}", std::io::Error::last_os_error());
                }
                let mut conn: Option<Conn> = None;
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let (error, reopened) = match stream {
                        Stream::New => (one_request(to, &pods).err(), false),
                        Stream::Open(_) => {
                            let reopened = conn.is_none();
                            let result = match conn.as_mut() {
                                Some(c) => c.ask(&pods),
                                None => Conn::open(to).and_then(|mut c| {
                                    let r = c.ask(&pods);
                                    conn = Some(c);
                                    r
                                }),
                            };
                            if result.is_err() {
                                conn = None;
                            }
                            (result.err(), reopened)
                        }
                    };
                    requests.lock().expect("requests").push(Request {
                        client: name.clone(),
                        stream,
                        started,
                        error: error.map(|e| format!("{e:#}")),
                        reopened,
                    });
                    std::thread::sleep(pause.saturating_sub(started.elapsed()));
                }
            }));
        }
        Ok(())
    }

    /// Starts the phase `name`: requests started from now on count for it.
    pub fn phase(&mut self, name: &str) {
        self.phases.push((name.to_string(), Instant::now()));
    }

    /// Stops every client; what they saw.
    pub fn stop(mut self) -> Outcome {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
        }
        let mut requests = std::mem::take(&mut *self.requests.lock().expect("requests"));
        requests.sort_by_key(|r| r.started);
        Outcome {
            phases: std::mem::take(&mut self.phases),
            requests,
        }
    }
}

/// The phases of a load and its requests, in the order they started.
pub struct Outcome {
    pub phases: Vec<(String, Instant)>,
    pub requests: Vec<Request>,
}

impl Outcome {
    /// Each phase's figures, in order.
    pub fn figures(&self) -> Vec<(String, Figures)> {
        figures(&self.phases, &self.requests)
    }

    /// The failed requests, at most `limit` of each phase: the phase, the seconds
    /// since it started, the client, the stream and the error.
    pub fn failures(&self, limit: usize) -> String {
        let mut out = String::new();
        for (i, (phase, start)) in self.phases.iter().enumerate() {
            let end = self.phases.get(i + 1).map(|(_, e)| *e);
            let failed: Vec<&Request> = self
                .requests
                .iter()
                .filter(|r| r.started >= *start && end.is_none_or(|e| r.started < e))
                .filter(|r| r.error.is_some())
                .collect();
            for r in failed.iter().take(limit) {
                out.push_str(&format!(
                    "{phase} +{:.2} s {} {:?}{}: {}\n",
                    (r.started - *start).as_secs_f64(),
                    r.client,
                    r.stream,
                    if r.reopened { " (reopened)" } else { "" },
                    r.error.as_deref().unwrap_or_default()
                ));
            }
            if failed.len() > limit {
                out.push_str(&format!("{phase}: {} more\n", failed.len() - limit));
            }
        }
        out
    }
}

impl Default for Load {
    fn default() -> Self {
        Self::new()
    }
}

/// The figures of each of `phases` (name, start; each ends where the next starts)
/// from `requests`.
pub fn figures(phases: &[(String, Instant)], requests: &[Request]) -> Vec<(String, Figures)> {
    let mut out: Vec<(String, Figures)> = phases
        .iter()
        .map(|(n, _)| (n.clone(), Figures::default()))
        .collect();
    let phase_of = |at: Instant| phases.iter().rposition(|(_, start)| *start <= at);
    let mut sorted: Vec<&Request> = requests.iter().collect();
    sorted.sort_by_key(|r| r.started);
    // The start of each client's first failed new connection since its last answer,
    // that one's phase, and how many failed since.
    let mut failing: std::collections::BTreeMap<&str, (Instant, usize, usize)> = Default::default();
    for r in sorted {
        let Some(p) = phase_of(r.started) else {
            continue;
        };
        let f = &mut out[p].1;
        match r.stream {
            Stream::New => {
                f.new += 1;
                if r.error.is_some() {
                    f.new_failed += 1;
                    failing.entry(&r.client).or_insert((r.started, p, 0)).2 += 1;
                } else if let Some((since, q, n)) = failing.remove(r.client.as_str()) {
                    let outage = r.started - since;
                    let g = &mut out[q].1;
                    g.new_outage = g.new_outage.max(outage);
                    g.new_failed_in_a_row = g.new_failed_in_a_row.max(n);
                }
            }
            Stream::Open(_) => {
                f.open += 1;
                if r.error.is_some() {
                    f.open_failed += 1;
                }
            }
        }
    }
    // A client still failing at the end: until the last phase's last request.
    if let Some(last) = requests.iter().map(|r| r.started).max() {
        for (since, q, n) in failing.into_values() {
            let g = &mut out[q].1;
            g.new_outage = g.new_outage.max(last - since);
            g.new_failed_in_a_row = g.new_failed_in_a_row.max(n);
        }
    }
    out
}

/// The figures as a table, a row per phase.
pub fn table(figures: &[(String, Figures)]) -> String {
    let mut s = String::from(
        "| phase | new connections | failed | most failed in a row | longest outage | requests on open connections | failed |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (name, f) in figures {
        s.push_str(&format!(
            "| {name} | {} | {} | {} | {:.1} s | {} | {} |\n",
            f.new,
            f.new_failed,
            f.new_failed_in_a_row,
            f.new_outage.as_secs_f64(),
            f.open,
            f.open_failed
        ));
    }
    s
}

/// A `GET /hostname` on a new connection to `to`, closed after the answer.
fn one_request(to: SocketAddr, pods: &[String]) -> Result<String> {
    let mut c = Conn::open(to)?;
    c.ask(pods)
}

/// A connection kept open.
struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(to: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect_timeout(&to, REQUEST_TIMEOUT)
            .with_context(|| format!("connecting to {to}"))?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Self { stream, reader })
    }

    /// Asks for `/hostname` and reads the whole answer (by its `Content-Length`),
    /// which must be one of `pods`.
    fn ask(&mut self, pods: &[String]) -> Result<String> {
        self.stream
            .write_all(b"GET /hostname HTTP/1.1\r\nHost: web\r\n\r\n")
            .context("sending")?;
        let mut line = String::new();
        self.reader.read_line(&mut line).context("reading")?;
        if !line.starts_with("HTTP/1.1 200") {
            bail!("answer {line:?}");
        }
        let mut length = None;
        loop {
            line.clear();
            if self.reader.read_line(&mut line).context("reading")? == 0 {
                bail!("the connection closed in the headers");
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = Some(v.trim().parse::<usize>().context("Content-Length")?);
                }
            }
        }
        let mut body = vec![0; length.context("no Content-Length")?];
        self.reader.read_exact(&mut body).context("reading")?;
        let body = String::from_utf8_lossy(&body).trim().to_string();
        if !pods.contains(&body) {
            bail!("answered by {body:?}, not one of {pods:?}");
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_count_each_request_in_its_phase_and_the_longest_outage() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let phases = vec![("a".to_string(), at(0)), ("b".to_string(), at(1000))];
        let r = |client: &str, stream, ms, ok: bool| Request {
            client: client.to_string(),
            stream,
            started: at(ms),
            error: (!ok).then(|| "reset".to_string()),
            reopened: false,
        };
        let requests = vec![
            r("c1", Stream::New, 100, true),
            r("c1", Stream::Open(0), 150, true),
            r("c1", Stream::New, 900, false),
            r("c1", Stream::New, 1100, false),
            r("c1", Stream::New, 1500, true),
            r("c2", Stream::New, 1200, false),
            r("c2", Stream::Open(0), 1250, false),
            r("c2", Stream::New, 1300, true),
        ];
        let f = figures(&phases, &requests);
        assert_eq!(
            f[0].1,
            Figures {
                new: 2,
                new_failed: 1,
                new_outage: Duration::from_millis(600),
                new_failed_in_a_row: 2,
                open: 1,
                open_failed: 0,
            }
        );
        assert_eq!(
            f[1].1,
            Figures {
                new: 4,
                new_failed: 2,
                new_outage: Duration::from_millis(100),
                new_failed_in_a_row: 1,
                open: 1,
                open_failed: 1,
            }
        );
        assert!(table(&f).contains("| a | 2 | 1 | 2 | 0.6 s | 1 | 0 |"));
    }
}
