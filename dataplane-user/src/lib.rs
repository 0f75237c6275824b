//! The sliceway node agent as a library: sources, the compiler, the map writer, the
//! kernel edge and the agent loop. The `sliceway-agent` binary is a thin CLI over it.

pub mod agent;
pub mod audit;
pub mod categorize;
pub mod cli;
pub mod compiler;
pub mod conntrack;
pub mod flows;
pub mod health;
pub mod healthcheck;
pub mod inspect;
pub mod interfaces;
pub mod kernel;
pub mod maglev;
pub mod memory_maps;
pub mod metrics;
pub mod model;
pub mod packet;
pub mod ranges;
pub mod source;
pub mod top;
pub mod writer;
