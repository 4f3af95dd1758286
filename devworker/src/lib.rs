//! smolbox-devworker: a local stand-in for `smolvm serve`, faithful on the
//! wire, with fault injection. Commands run on the host without isolation.
