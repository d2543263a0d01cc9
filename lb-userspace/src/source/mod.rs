//! Sources of the model: the services file (standalone mode) today, the
//! apiserver next. A source only produces models; it never touches maps.
pub mod file;
pub mod kubernetes;
