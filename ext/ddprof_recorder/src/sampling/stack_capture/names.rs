//! How a frame object is named (`stack_capture`, "Names"): from the frame object alone, with
//! the GVL; [`spell`] rewrites Ruby's `<...>` labels.
use magnus::{rb_sys::FromRawValue, RString, Value};

use super::{Names, GC_LEAF};

/// How `<main>` is spelled (see [`spell`]).
pub(super) const MAIN: &str = "main";

/// A frame's names (`stack_capture`, "Names").
pub(super) fn names_of(frame: rb_sys::VALUE) -> Names {
    if frame == GC_LEAF {
        return Names { name: "(garbage collection)".into(), path: Some("".into()) };
    }
    if qualified() {
        qualified_names(frame)
    } else {
        base_names(frame)
    }
}

/// Whether frames get qualified names (`stack_capture`, "Names"): on Ruby 3.3 and later always,
/// since every frame object then comes from the public API (`rb_profile_frames`,
/// `rb_profile_thread_frames`); on 3.1 once `vm::frames`' self-check passed.
pub(super) fn qualified() -> bool {
    cfg!(ruby_gte_3_3) || crate::vm::frames::available()
}

/// The weaker names: what a Location gives.
fn base_names(frame: rb_sys::VALUE) -> Names {
    // SAFETY: `frame` comes from rb_profile_frames on the live stack; GVL held. In Ruby 3.1
    // `rb_profile_frame_base_label` is nil for a C method: its name is the method's.
    let (label, path) = unsafe {
        (rb_sys::rb_profile_frame_base_label(frame), rb_sys::rb_profile_frame_path(frame))
    };
    let label = if label == rb_sys::Qnil as rb_sys::VALUE {
        // SAFETY: as above.
        unsafe { rb_sys::rb_profile_frame_method_name(frame) }
    } else {
        label
    };
    let path = text(path);
    let name = spell(&text(label).unwrap_or_default(), path.as_deref().unwrap_or(""));
    Names { name: name.into(), path }
}

/// The qualified names: a method entry's owner and name, an iseq's label.
fn qualified_names(frame: rb_sys::VALUE) -> Names {
    // SAFETY: `frame` is a live frame object (an iseq or a method entry) read from a live
    // stack, kept alive since; GVL held. Every call below takes either.
    unsafe {
        let flags = *(frame as *const usize);
        let is_ment = flags & 0x1f == 0x1a && (flags >> 12) & 0xf == 6;
        if !is_ment {
            let path = text(rb_sys::rb_profile_frame_path(frame));
            let label = text(rb_sys::rb_profile_frame_label(frame)).unwrap_or_default();
            let name = spell(&label, path.as_deref().unwrap_or(""));
            return Names { name: name.into(), path };
        }
        // A C method's entry has no path (`rb_profile_frame_path`: nil when `frame2iseq`
        // finds no iseq). On 3.3+ `rb_profile_frames` gives no bmethod entry (it gives the
        // block's iseq), so the type is read only where `vm::frames`' layouts were checked.
        let kind = if crate::vm::frames::available() {
            crate::vm::frames::method_type(frame)
        } else if rb_sys::rb_profile_frame_path(frame) == rb_sys::Qnil as rb_sys::VALUE {
            crate::vm::frames::METHOD_CFUNC
        } else {
            crate::vm::frames::METHOD_ISEQ
        };
        match kind {
            crate::vm::frames::METHOD_BMETHOD => {
                // `rb_profile_frame_method_name` and `_path` are nil for a bmethod's entry:
                // the name it was defined with, and the path of the block it runs.
                let method = text(rb_sys::rb_id2str(crate::vm::frames::original_id(frame)));
                let name = qualify(frame, &method.unwrap_or_default());
                let path = crate::vm::frames::bmethod_iseq(frame)
                    .and_then(|iseq| text(rb_sys::rb_profile_frame_path(iseq)));
                Names { name: name.into(), path }
            }
            kind => {
                let method = text(rb_sys::rb_profile_frame_method_name(frame));
                let name = method.map_or_else(String::new, |method| qualify(frame, &method));
                let path = if kind == crate::vm::frames::METHOD_CFUNC {
                    None
                } else {
                    text(rb_sys::rb_profile_frame_path(frame))
                };
                Names { name: name.into(), path }
            }
        }
    }
}

/// `method` qualified by the owner of the method entry `frame`, as
/// `rb_profile_frame_qualified_method_name` does (`Klass#meth`, `Klass.meth` for a singleton
/// method, `meth` alone when there is no class path), but not misled by Ruby 3.3 into naming
/// a module's method found through an include as a singleton method (`vm::defined_in_iclass`).
///
/// # Safety
///
/// `frame` is a live method entry; GVL held.
unsafe fn qualify(frame: rb_sys::VALUE, method: &str) -> String {
    // SAFETY: the caller's contract; both calls take a method entry.
    let (class, singleton) = unsafe {
        (
            text(rb_sys::rb_profile_frame_classpath(frame)),
            rb_sys::rb_profile_frame_singleton_method_p(frame) == rb_sys::Qtrue as rb_sys::VALUE
                && !crate::vm::defined_in_iclass(frame),
        )
    };
    match class {
        Some(class) => format!("{class}{}{method}", if singleton { "." } else { "#" }),
        None => method.to_owned(),
    }
}

/// Ruby's `<...>` labels, spelled so that they read the same in every viewer (`stack_capture`):
/// `<main>` is `main`, `<top (required)>` is `top level of PATH` (`path`: the file's),
/// `<class:Node>` is `class Node`, `<module:M>` is `module M`, any other `<label>` is
/// `label` (a letter first: `<=>` is a method's name); a `block in `, `block (N levels) in `,
/// `rescue in ` or `ensure in ` before them stays. Other names are left as they are.
pub(super) fn spell(label: &str, path: &str) -> String {
    let (prefix, scope) = match label.rfind(" in <") {
        Some(i) if label.ends_with('>') => label.split_at(i + 4),
        _ if label.starts_with('<') && label.ends_with('>') => ("", label),
        _ => return label.to_owned(),
    };
    let inner = &scope[1..scope.len() - 1];
    // Ruby's scope labels start with a letter; an operator method (`<=>`) is no label.
    if !inner.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return label.to_owned();
    }
    let spelled = if inner == "main" {
        MAIN.to_owned()
    } else if inner == "top (required)" {
        format!("top level of {path}")
    } else if let Some(class) = inner.strip_prefix("class:") {
        format!("class {class}")
    } else if let Some(module) = inner.strip_prefix("module:") {
        format!("module {module}")
    } else {
        inner.to_owned()
    };
    format!("{prefix}{spelled}")
}

/// A Ruby String's text (non-UTF-8 bytes become U+FFFD), or None for nil and non-Strings.
fn text(v: rb_sys::VALUE) -> Option<Box<str>> {
    // SAFETY: `v` is a live VALUE just returned by Ruby; GVL held.
    let s = RString::from_value(unsafe { Value::from_raw(v) })?;
    // SAFETY: copied at once, before any Ruby code runs.
    let bytes = unsafe { s.as_slice() };
    Some(String::from_utf8_lossy(bytes).into())
}
