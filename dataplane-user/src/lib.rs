//! The sliceway node agent as a library, by stage: [`source`] (the API server or a
//! manifest directory) gives the objects, [`model`] is the agent's lean copy of them,
//! [`compiler`] turns them into desired frontends, [`writer`] writes those into the
//! maps, [`kernel`] loads, attaches and runs the programs; [`agent`] is the loop that
//! drives them, [`serve`] its HTTP endpoints, [`cmd`] the other subcommands. The
//! `sliceway-agent` binary is a thin CLI over it.

pub mod agent;
pub mod cmd;
pub mod compiler;
pub mod kernel;
pub mod kube_proxy;
pub mod model;
pub mod serve;
pub mod source;
pub mod writer;

/// An error and its sources on one line, `outer: inner: ...`; a source whose message
/// the line already holds (many errors repeat their source's) is not said twice.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_msg = s.to_string();
        if !msg.contains(&s_msg) {
            msg.push_str(&format!(": {s_msg}"));
        }
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_error_chain_names_each_source_once() {
        let inner = E("connection refused", None);
        let mid = E("connecting: connection refused", Some(Box::new(inner)));
        let outer = E("loading the program", Some(Box::new(mid)));
        assert_eq!(
            super::error_chain(&outer),
            "loading the program: connecting: connection refused"
        );
        assert_eq!(super::error_chain(&E("alone", None)), "alone");
    }
}
