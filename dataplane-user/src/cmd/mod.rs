//! The command line: its definition ([`cli`]) and `run --config`'s kube-proxy
//! configuration file ([`config`]); and the subcommands besides `run`, the operator's
//! views of a running agent's pinned maps: `list` and `trace`
//! ([`inspect`]), `top` ([`top`]) and `conntrack` ([`flows`]).

pub mod cli;
pub mod config;
pub mod flows;
pub mod inspect;
pub mod top;
