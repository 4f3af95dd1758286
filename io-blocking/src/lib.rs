//! smolbox-blocking: the blocking shell on mio, with the same API as
//! `smolbox-tokio` minus `async`. No tokio anywhere in its dependency tree.
