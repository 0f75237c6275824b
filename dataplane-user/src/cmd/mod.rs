//! The subcommands besides `run`: the command line's definition ([`cli`]), and the
//! operator's views of a running agent's pinned maps: `list` and `trace`
//! ([`inspect`]), `top` ([`top`]) and `conntrack` ([`flows`]).

pub mod cli;
pub mod flows;
pub mod inspect;
pub mod top;
