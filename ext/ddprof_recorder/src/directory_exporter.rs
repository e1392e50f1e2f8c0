//! The native method of `DdprofRecorder::DirectoryExporter` (lib/ddprof_recorder/directory_exporter.rb):
//! `_native_statvfs(path)`, the free space of the filesystem that holds `path`, which the
//! exporter compares with its floor (`min_free_bytes:`, `min_free_fraction:`) before each
//! window. Ruby's standard library has no statvfs (`File::Stat` describes a file, not its
//! filesystem), and reading `df`'s output would start a process per window.
//!
//! statvfs(3) is POSIX (glibc and musl on Linux, macOS, the BSDs), so this needs nothing of a
//! particular Ruby version. It returns what an unprivileged process may still write,
//! `f_bavail` blocks (not `f_bfree`, which counts the blocks reserved for root: 5% of an ext4
//! filesystem by default), and the filesystem's size, `f_blocks`, both in units of
//! `f_frsize`, the fragment size that POSIX says these counts are in (not `f_bsize`, the
//! preferred I/O size, which differs on some filesystems).
//!
//! The call runs without the GVL: on a network filesystem (NFS, CIFS) it asks the server, and a
//! server that is slow or gone would otherwise stop every Ruby thread for that long.
use std::ffi::CString;
use std::mem::MaybeUninit;

use magnus::{function, prelude::*, Error, RModule, RString, Ruby, Value};

use crate::recorder::errors::{arg_error, entry, type_error};
use crate::recorder::nogvl::nogvl;

/// A filesystem's space, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// What an unprivileged process may still write (`f_bavail * f_frsize`).
    pub available: u64,
    /// The filesystem's size (`f_blocks * f_frsize`).
    pub total: u64,
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class = module.define_class("DirectoryExporter", ruby.class_object())?;
    // `_native_statvfs(path)`: `[available, total]` bytes, or the errno (an Integer) on failure.
    class.define_singleton_method("_native_statvfs", function!(native_statvfs, 1))?;
    Ok(())
}

/// statvfs(3) of `path`.
///
/// # Errors
/// The errno that statvfs set (ENOENT, EACCES, ENOTDIR...).
pub fn statvfs(path: &CString) -> Result<Space, i32> {
    let mut buf = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `buf` is valid for
    // writes of one `struct statvfs`, which statvfs fills entirely when it returns 0.
    let rc = unsafe { libc::statvfs(path.as_ptr(), buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    // SAFETY: statvfs returned 0, so it wrote the whole struct.
    let buf = unsafe { buf.assume_init() };
    // The fields' types differ between platforms (u64 on Linux, u32 on macOS); `as u64`
    // widens each without loss on both.
    #[allow(clippy::unnecessary_cast)]
    let (bavail, blocks, frsize) = (buf.f_bavail as u64, buf.f_blocks as u64, buf.f_frsize as u64);
    Ok(Space { available: bavail.saturating_mul(frsize), total: blocks.saturating_mul(frsize) })
}

/// `[available, total]` of the filesystem holding `path`, or the errno as an Integer, which the
/// Ruby side raises as its `Errno::` class (`SystemCallError.new`): magnus has no constructor
/// for those.
fn native_statvfs(ruby: &Ruby, path: Value) -> Result<Value, Error> {
    entry(ruby, || {
        let s =
            RString::from_value(path).ok_or_else(|| type_error(ruby, "path must be a String"))?;
        // SAFETY: the slice is copied at once, before any Ruby code or allocation can run.
        let bytes = unsafe { s.as_slice() }.to_vec();
        let c_path =
            CString::new(bytes).map_err(|_| arg_error(ruby, "path must not contain a NUL byte"))?;
        match nogvl(ruby, move || statvfs(&c_path))? {
            Ok(space) => Ok(ruby
                .ary_new_from_values(&[
                    ruby.integer_from_u64(space.available).as_value(),
                    ruby.integer_from_u64(space.total).as_value(),
                ])
                .as_value()),
            Err(errno) => Ok(ruby.integer_from_i64(i64::from(errno)).as_value()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_root_filesystem() {
        let space = statvfs(&CString::new("/").unwrap()).unwrap();
        assert!(space.total > 0);
        assert!(space.available <= space.total);
    }

    #[test]
    fn a_missing_path_is_enoent() {
        let missing = CString::new("/nonexistent/ddprof_recorder/statvfs").unwrap();
        assert_eq!(statvfs(&missing), Err(libc::ENOENT));
    }
}
