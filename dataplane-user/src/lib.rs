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
