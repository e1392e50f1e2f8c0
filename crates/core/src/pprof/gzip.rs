//! gzip output: the encoder streams into flate2's gzip encoder (zlib-rs backend).

use std::io::Write;

use super::buffer::{fit, GrowByQuarter};
use super::encode::{encode_streaming, STREAM_CHUNK};
use crate::error::SerializeError;
use crate::profile::Profile;
use crate::sample::ValueType;
use crate::time::Timestamp;

/// gzip level used for [`Compression::Gzip`](super::Compression::Gzip).
///
/// Why 1: only level 1 keeps encode + compress of the medium workload within its 250 ms budget,
/// and pprof compresses little better at higher levels. The measured table (levels 1-9,
/// zlib-rs against miniz_oxide): bench/RESULTS.md, "gzip: level and backend".
pub const GZIP_LEVEL: u32 = 1;

/// [`encode`](super::encode) then gzip, streaming: the encoder hands the gzip encoder 64 KiB at
/// a time instead of a whole raw copy of the profile (measured on the medium workload: peak
/// heap during a gzip serialization 76 -> ~30 MB).
pub fn encode_gzip(
    profile: &mut Profile,
    value_types: &[ValueType],
    comments: &[String],
    finish: Timestamp,
) -> Result<Vec<u8>, SerializeError> {
    let mut output = GrowByQuarter { bytes: Vec::new(), min_step: STREAM_CHUNK };
    let mut encoder =
        flate2::write::GzEncoder::new(&mut output, flate2::Compression::new(GZIP_LEVEL));
    encode_streaming(profile, value_types, comments, finish, &mut encoder)
        .map_err(compression_error)?;
    encoder.finish().map_err(compression_error)?;
    let mut bytes = output.bytes;
    // The growth steps can leave up to a fifth of the buffer unused.
    fit(&mut bytes);
    Ok(bytes)
}

/// gzip-compresses an encoded profile (for `merge`, which encodes with prost).
pub fn gzip(raw: &[u8]) -> Result<Vec<u8>, SerializeError> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 4),
        flate2::Compression::new(GZIP_LEVEL),
    );
    encoder.write_all(raw).map_err(compression_error)?;
    encoder.finish().map_err(compression_error)
}

fn compression_error(e: std::io::Error) -> SerializeError {
    SerializeError::Compression(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{encode, output_capacity};
    use crate::sample::{Frame, Label, LabelValue, Sample, SpanId};

    fn vts() -> Vec<ValueType> {
        vec![ValueType::new("cpu-time", "nanoseconds"), ValueType::new("wall-time", "nanoseconds")]
    }

    fn gunzip(gz: &[u8]) -> Vec<u8> {
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz), &mut back).unwrap();
        back
    }

    #[test]
    fn gzip_is_the_same_bytes() {
        let mut p = Profile::new(2, Timestamp::default());
        let frames = [Frame { function_name: "f", filename: "x.rb", line: 1 }];
        p.add(&Sample { frames: &frames, omitted_frames: 0, values: &[1, 2], labels: &[] }, 10)
            .unwrap();
        let raw = encode(&mut p, &vts(), &[], Timestamp::default());
        assert_eq!(gunzip(&gzip(&raw).unwrap()), raw);
    }

    /// The streaming gzip path hands the compressor many chunks: a profile several chunks
    /// long, with labels and endpoints, decompresses to exactly the raw encoding, and the raw
    /// encoding's up-front size was exact (no spare capacity).
    #[test]
    fn streamed_gzip_equals_raw_encoding_and_raw_is_sized_exactly() {
        let names: Vec<String> = (0..3000).map(|i| format!("function_{i}")).collect();
        let fill = || {
            let mut p = Profile::new(2, Timestamp { secs: 3, nanos: 4 });
            for i in 0..8_000usize {
                let frames: Vec<Frame<'_>> = (0..(i % 50))
                    .map(|d| Frame {
                        function_name: &names[(i * 7 + d * 13) % names.len()],
                        filename: "file.rb",
                        line: (d as i64) - 3,
                    })
                    .collect();
                let labels = [
                    Label { key: "local root span id", value: LabelValue::Num((i % 100) as i64) },
                    Label { key: "thread name", value: LabelValue::Str(&names[i % 16]) },
                ];
                let values = [i as i64, -(i as i64)];
                let sample = Sample {
                    frames: &frames,
                    omitted_frames: i % 3,
                    values: &values,
                    labels: &labels,
                };
                p.add(&sample, 40).unwrap();
            }
            p.record_endpoint(SpanId::Num(7), "GET /seven");
            p
        };
        let finish = Timestamp { secs: 9, nanos: 1 };
        let raw = encode(&mut fill(), &vts(), &[], finish);
        assert!(raw.len() > 4 * STREAM_CHUNK);
        assert_eq!(raw.capacity(), output_capacity(raw.len()), "sized once, up front");
        let gz = encode_gzip(&mut fill(), &vts(), &[], finish).unwrap();
        assert_eq!(gz.capacity(), output_capacity(gz.len()));
        assert!(gunzip(&gz) == raw, "gzip stream differs from the raw encoding");
        <crate::pprof::PprofProfile as prost::Message>::decode(&raw[..]).unwrap();
    }
}
