//! How a frame object is named (`stack_capture`, "Names"): from the frame object alone, with
//! the GVL; [`spell`] rewrites Ruby's `<...>` labels, [`template_name`] the per-process names
//! of compiled templates.
use magnus::{rb_sys::FromRawValue, RString, Value};

use super::{Names, GC_LEAF};

/// How `<main>` is spelled (see [`spell`]).
pub(super) const MAIN: &str = "main";

/// How the frame cache keeps a frame's names.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// By the frame object, which the cache then marks (`stack_capture`'s module doc).
    ByObject,
    /// By the names alone: code eval'd from a string, named for its file. `ERB#result` makes
    /// new iseqs at each render; kept by object, every sampled render's would stay alive in the
    /// cache (measured before this: an ERB loop at 999 Hz grew from 24 to 57 MB in 15 s on
    /// Debian's 3.1.2, where it stays at 14 MB unprofiled).
    ByName,
}

/// A frame's names (`stack_capture`, "Names"), and how the cache keeps them.
pub(super) fn names_of(frame: rb_sys::VALUE) -> (Names, Keep) {
    if frame == GC_LEAF {
        let names = Names { name: "(garbage collection)".into(), path: Some("".into()) };
        return (names, Keep::ByObject);
    }
    if qualified() {
        qualified_names(frame)
    } else {
        (base_names(frame), Keep::ByObject)
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
    let name = label_name(&text(label).unwrap_or_default(), path.as_deref().unwrap_or(""));
    Names { name: name.into(), path }
}

/// A Location's label (a `base_label`, or a C method's name) as a frame's name: a compiled
/// template's method by [`template_name`], any other spelled by [`spell`].
pub(super) fn label_name(label: &str, path: &str) -> String {
    template_name(label, path).unwrap_or_else(|| spell(label, path))
}

/// The qualified names: a method entry's owner and name, an iseq's label; eval'd code's and a
/// compiled template's file.
fn qualified_names(frame: rb_sys::VALUE) -> (Names, Keep) {
    // SAFETY: `frame` is a live frame object (an iseq or a method entry) read from a live
    // stack, kept alive since; GVL held. Every call below takes either.
    unsafe {
        let flags = *(frame as *const usize);
        let is_ment = flags & 0x1f == 0x1a && (flags >> 12) & 0xf == 6;
        if !is_ment {
            let path = text(rb_sys::rb_profile_frame_path(frame));
            // Eval'd code (`vm::frames::in_eval`, whose layouts are known only once checked):
            // its file, `(erb)`, the `ERB#filename`, `(eval)`.
            let named_for_file = path.as_deref().is_some_and(|path| !path.is_empty());
            if named_for_file && crate::vm::frames::available() && crate::vm::frames::in_eval(frame)
            {
                return (Names { name: path.clone().unwrap_or_default(), path }, Keep::ByName);
            }
            let label = text(rb_sys::rb_profile_frame_label(frame)).unwrap_or_default();
            let name = spell(&label, path.as_deref().unwrap_or(""));
            return (Names { name: name.into(), path }, Keep::ByObject);
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
                (Names { name: name.into(), path }, Keep::ByObject)
            }
            kind => {
                let method = text(rb_sys::rb_profile_frame_method_name(frame));
                let path = if kind == crate::vm::frames::METHOD_CFUNC {
                    None
                } else {
                    text(rb_sys::rb_profile_frame_path(frame))
                };
                let template =
                    method.as_deref().zip(path.as_deref()).and_then(|(m, p)| template_name(m, p));
                let name = template.unwrap_or_else(|| {
                    method.map_or_else(String::new, |method| qualify(frame, &method))
                });
                (Names { name: name.into(), path }, Keep::ByObject)
            }
        }
    }
}

/// The name of a compiled template's method, the same in every process, or None for any
/// other method (`method`: its name; `path`: its file, which the template compiler gave to
/// `module_eval`/`class_eval`):
///
/// - ActionView (`ActionView::Template#method_name`, Rails 6.1 and 7): `_` + the template's
///   short identifier (its path less `Rails.root/`) with every character but `a-z` and `_`
///   made `_`, then `__`, the identifier's `String#hash` (seeded per process; its `-` made
///   `_`) and `_` and the Template's `__id__`:
///   `_app_views_pages_index_html_erb___2930487_60120`. Named by the short identifier itself,
///   the end of `path` that the method's name spells (`app/views/pages/index.html.erb`), or
///   the whole path when there is no `Rails.root` before it.
/// - Tilt (Sinatra's templates; Tilt 2.0 `compile_template_method`): `__tilt_` + the
///   compiling thread's `object_id`. Named by `path`, the template's file.
pub(super) fn template_name(method: &str, path: &str) -> Option<String> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if method.strip_prefix("__tilt_").is_some_and(digits) {
        return (!path.is_empty()).then(|| path.to_owned());
    }
    let (rest, id) = method.strip_prefix('_')?.rsplit_once('_')?;
    if !digits(id) {
        return None;
    }
    let hashless = rest.trim_end_matches(|c: char| c.is_ascii_digit());
    if hashless.len() == rest.len() {
        return None;
    }
    let rest = hashless.strip_suffix("__")?;
    // A negative hash leaves one more `_`; a stem may end in `_` too: the path decides.
    let stems = [rest.strip_suffix('_'), Some(rest)];
    stems.into_iter().flatten().find_map(|stem| spelled_suffix(path, stem)).map(str::to_owned)
}

/// The end of `path` (a whole path, or what follows a `/`) that ActionView spells as `stem`
/// (every character but `a-z` and `_` as `_`), if any.
fn spelled_suffix<'a>(path: &'a str, stem: &str) -> Option<&'a str> {
    if stem.is_empty() || !stem.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        return None;
    }
    let count = stem.len(); // ASCII: one byte per character
    let start = path.char_indices().rev().nth(count - 1)?.0;
    let suffix = &path[start..];
    let spelled = suffix.chars().map(|c| if c.is_ascii_lowercase() || c == '_' { c } else { '_' });
    let at_boundary = start == 0 || path[..start].ends_with('/');
    (at_boundary && spelled.eq(stem.chars())).then_some(suffix)
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

#[cfg(test)]
mod tests {
    use super::template_name;

    const VIEW: &str = "/srv/app/app/views/pages/index.html.erb";

    #[test]
    fn actionview_methods_are_named_by_their_short_identifier() {
        // A negative hash (its `-` made `_`) and a positive one, as two processes compile it.
        let negative = "_app_views_pages_index_html_erb___2930487_60120";
        let positive = "_app_views_pages_index_html_erb__1294311015420417337_120";
        for method in [negative, positive] {
            assert_eq!(
                template_name(method, VIEW).as_deref(),
                Some("app/views/pages/index.html.erb")
            );
        }
        // No Rails.root: the identifier is the whole path.
        let whole = "__srv_app_app_views_pages_index_html_erb__42_7";
        assert_eq!(template_name(whole, VIEW).as_deref(), Some(VIEW));
        // Characters other than a-z and _ (a capital, a dash, a non-ASCII letter) are `_`.
        let odd = "/srv/app/app/views/Café/mini-cart.html.erb";
        let method = "_app_views__af__mini_cart_html_erb___3_4"; // Ruby's `tr("^a-z_", "_")`
        assert_eq!(
            template_name(method, odd).as_deref(),
            Some("app/views/Café/mini-cart.html.erb")
        );
    }

    #[test]
    fn a_stem_that_ends_in_an_underscore_is_told_from_a_negative_hash_by_the_path() {
        let path = "/srv/app/app/views/x_.erb";
        assert_eq!(
            template_name("_app_views_x__erb__5_6", path).as_deref(),
            Some("app/views/x_.erb")
        );
        let path = "/srv/app/app/views/x_";
        assert_eq!(template_name("_app_views_x____5_6", path).as_deref(), Some("app/views/x_"));
        assert_eq!(template_name("_app_views_x___5_6", path).as_deref(), Some("app/views/x_"));
    }

    #[test]
    fn tilt_methods_are_named_by_their_file() {
        let path = "/srv/app/views/list.erb";
        assert_eq!(template_name("__tilt_47000", path).as_deref(), Some(path));
        assert_eq!(template_name("__tilt_47000", ""), None);
        assert_eq!(template_name("__tilt_", path), None);
        assert_eq!(template_name("__tilt_x1", path), None);
    }

    #[test]
    fn other_methods_keep_their_names() {
        for method in [
            "render",
            "_render",
            "_app_views_pages_index_html_erb",     // no suffix
            "_app_views_pages_index_html_erb_1_2", // one `_` before the hash
            "_app_views_pages_index_html_erb___x_2",
            "_app_views_pages_index_html_erb___2_",
            "_views_other_html_erb___2_3", // a name the path does not spell
            "_ges_index_html_erb___2_3",   // not from a `/`
            "__2_3",                       // no stem
        ] {
            assert_eq!(template_name(method, VIEW), None, "{method}");
        }
    }
}
