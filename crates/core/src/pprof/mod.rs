//! pprof (`perftools.profiles.Profile`): the recorder's encoder ([`encode`], [`encode_gzip`]),
//! the capacity policy of its output buffers ([`output_capacity`]), and prost messages for
//! reading pprof files ([`PprofProfile`] and the messages it holds).
mod buffer;
mod decode;
mod encode;
mod gzip;

pub use buffer::{output_capacity, LARGE_OUTPUT};
pub use decode::{
    PprofFunction, PprofLabel, PprofLine, PprofLocation, PprofMapping, PprofProfile, PprofSample,
    PprofValueType,
};
pub use encode::encode;
pub use gzip::{encode_gzip, gzip, GZIP_LEVEL};

/// What `serialize` returns: the raw protobuf or a gzip stream of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Gzip,
}
