//! Exports for a module's mutable globals.
//!
//! wizer's rewrite keeps only the module's own exports, so `__stack_pointer` and the other
//! mutable globals an interpreter keeps its state in are out of the host's reach. Capturing and
//! restoring an instance (`engine::state`) needs them: images are rewritten to export each one
//! as `wasmbox:global:{index}`, and memory 0 as `wasmbox:memory`: the mark of a rewritten
//! module, without which a capture would silently miss globals. Every other section is copied
//! byte for byte.

use std::ops::Range;

use wasm_encoder::{Encode, RawSection};
use wasmparser::{BinaryReader, Encoding, ExternalKind, Parser, Payload, TypeRef};

use super::{EngineError as Error, Result};

/// The export name of global `index`: this prefix and the index in the global index space.
pub const GLOBAL_EXPORT_PREFIX: &str = "wasmbox:global:";

/// Memory 0's export in a rewritten module.
pub const MEMORY_EXPORT: &str = "wasmbox:memory";

pub fn global_export_name(index: u32) -> String {
    format!("{GLOBAL_EXPORT_PREFIX}{index}")
}

/// The global index an export name of ours stands for.
pub fn parse_global_export_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(GLOBAL_EXPORT_PREFIX)?;
    // One spelling per index, so a name never collides with another for the same global.
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    digits.parse().ok()
}

const CUSTOM: u8 = 0;
const EXPORT: u8 = 7;
/// Sections that come after the export section (start, element, code, data, data count).
const AFTER_EXPORT: [u8; 5] = [8, 9, 10, 11, 12];

/// What [`export_globals`] needs to know about a module.
struct Layout {
    /// Every section, in order: id and content range (after the id and size).
    sections: Vec<(u8, Range<usize>)>,
    /// Defined mutable globals, by index in the global index space.
    mutable: Vec<u32>,
    /// Memories, imported and defined.
    memories: u32,
    /// Existing exports: name, kind and index.
    exports: Vec<(String, ExternalKind, u32)>,
}

fn bad(e: impl std::fmt::Display) -> Error {
    Error::Wasm(format!("exporting the module's globals: {e}"))
}

fn layout(wasm: &[u8]) -> Result<Layout> {
    let mut parser = Parser::new(0);
    let mut offset = 0;
    let mut imported_globals = 0u32;
    let mut layout = Layout {
        sections: Vec::new(),
        mutable: Vec::new(),
        memories: 0,
        exports: Vec::new(),
    };
    loop {
        let (payload, consumed) = match parser.parse(&wasm[offset..], true).map_err(bad)? {
            wasmparser::Chunk::Parsed { consumed, payload } => (payload, consumed),
            wasmparser::Chunk::NeedMoreData(_) => return Err(bad("the module is truncated")),
        };
        offset += consumed;
        if let Some(section) = payload.as_section() {
            layout.sections.push(section);
        }
        match payload {
            Payload::Version { encoding, .. } if encoding != Encoding::Module => {
                return Err(bad("a component, not a core module"));
            }
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    match import.map_err(bad)?.ty {
                        TypeRef::Global(_) => imported_globals += 1,
                        TypeRef::Memory(_) => layout.memories += 1,
                        _ => {}
                    }
                }
            }
            Payload::MemorySection(reader) => {
                layout.memories += reader.count();
            }
            Payload::GlobalSection(reader) => {
                for (i, global) in reader.into_iter().enumerate() {
                    if global.map_err(bad)?.ty.mutable {
                        layout.mutable.push(imported_globals + i as u32);
                    }
                }
            }
            Payload::ExportSection(reader) => {
                for export in reader {
                    let e = export.map_err(bad)?;
                    layout.exports.push((e.name.to_string(), e.kind, e.index));
                }
            }
            // Function bodies are copied whole: no need to walk them.
            Payload::CodeSectionStart { size, .. } => {
                parser.skip_section();
                offset += size as usize;
            }
            Payload::End(_) => break,
            _ => {}
        }
    }
    Ok(layout)
}

/// The mutable globals `wasm` defines (not imports), by index: those [`export_globals`] exports.
pub fn mutable_globals(wasm: &[u8]) -> Result<Vec<u32>> {
    Ok(layout(wasm)?.mutable)
}

/// What in an instance of `wasm` could change at run time besides memory 0 and the mutable
/// globals, one line each; empty when nothing can. Recycling an instance (`engine::state::reset`)
/// puts back only those two, so it is allowed only for modules where this is empty: no
/// instruction that changes a table or drops a segment, one memory, and no imported table,
/// memory or global (the host's, which a guest could change).
pub fn state_beyond_memory(wasm: &[u8]) -> Result<Vec<String>> {
    use wasmparser::Operator as Op;
    let mut found = std::collections::BTreeSet::new();
    let mut memories = 0u32;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(bad)? {
            Payload::Version { encoding, .. } if encoding != Encoding::Module => {
                return Err(bad("a component, not a core module"));
            }
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    match import.map_err(bad)?.ty {
                        TypeRef::Table(_) => found.insert("an imported table".to_string()),
                        TypeRef::Memory(_) => found.insert("an imported memory".to_string()),
                        TypeRef::Global(_) => found.insert("an imported global".to_string()),
                        _ => false,
                    };
                }
            }
            Payload::MemorySection(reader) => memories += reader.count(),
            Payload::CodeSectionEntry(body) => {
                let mut ops = body.get_operators_reader().map_err(bad)?;
                while !ops.eof() {
                    let what = match ops.read().map_err(bad)? {
                        Op::TableSet { .. } => "table.set",
                        Op::TableGrow { .. } => "table.grow",
                        Op::TableFill { .. } => "table.fill",
                        Op::TableCopy { .. } => "table.copy",
                        Op::TableInit { .. } => "table.init",
                        Op::ElemDrop { .. } => "elem.drop",
                        Op::DataDrop { .. } => "data.drop",
                        _ => continue,
                    };
                    found.insert(format!("the instruction {what}"));
                }
            }
            _ => {}
        }
    }
    if memories > 1 {
        found.insert(format!("{memories} memories"));
    }
    Ok(found.into_iter().collect())
}

/// `wasm` with an export `wasmbox:global:{index}` for each mutable global it defines and
/// `wasmbox:memory` for memory 0; the export section is rebuilt (its existing entries kept as
/// they were) or added, every other section is copied as it is. Reference-typed globals are
/// exported too: capturing one is what fails. A second pass adds nothing.
pub fn export_globals(wasm: &[u8]) -> Result<Vec<u8>> {
    let layout = layout(wasm)?;
    let mut wanted: Vec<(String, ExternalKind, u32)> = layout
        .mutable
        .iter()
        .map(|&i| (global_export_name(i), ExternalKind::Global, i))
        .collect();
    if layout.memories > 0 {
        wanted.push((MEMORY_EXPORT.to_string(), ExternalKind::Memory, 0));
    }
    for (name, kind, index) in &layout.exports {
        let ours = parse_global_export_name(name).is_some() || name == MEMORY_EXPORT;
        if ours
            && !wanted
                .iter()
                .any(|w| w.0 == *name && w.1 == *kind && w.2 == *index)
        {
            return Err(bad(format!(
                "the module already exports {name} as something else ({kind:?} {index})"
            )));
        }
    }
    let missing: Vec<_> = wanted
        .into_iter()
        .filter(|w| !layout.exports.iter().any(|e| e.0 == w.0))
        .collect();
    if missing.is_empty() {
        return Ok(wasm.to_vec());
    }

    // The export section's content: the new count, the old entries' bytes, then ours.
    let mut exports = Vec::new();
    let old = layout.sections.iter().find(|(id, _)| *id == EXPORT);
    let old_entries = match old {
        Some((_, range)) => {
            let mut reader = BinaryReader::new(&wasm[range.clone()], range.start);
            reader.read_var_u32().map_err(bad)?;
            &wasm[reader.original_position()..range.end]
        }
        None => &[],
    };
    let count = u32::try_from(layout.exports.len() + missing.len()).map_err(bad)?;
    count.encode(&mut exports);
    exports.extend_from_slice(old_entries);
    for (name, kind, index) in &missing {
        name.as_str().encode(&mut exports);
        exports.push(match kind {
            ExternalKind::Memory => wasm_encoder::ExportKind::Memory,
            _ => wasm_encoder::ExportKind::Global,
        } as u8);
        index.encode(&mut exports);
    }
    let export_section = RawSection {
        id: EXPORT,
        data: &exports,
    };

    // Without an export section, ours goes before the first section that must follow it, or
    // after the last non-custom section (trailing custom sections, such as names, stay last).
    let insert_at = match old {
        Some(_) => None,
        None => Some(
            layout
                .sections
                .iter()
                .position(|(id, _)| AFTER_EXPORT.contains(id))
                .unwrap_or_else(|| {
                    layout
                        .sections
                        .iter()
                        .rposition(|(id, _)| *id != CUSTOM)
                        .map_or(0, |i| i + 1)
                }),
        ),
    };

    let mut module = wasm_encoder::Module::new();
    for (i, (id, range)) in layout.sections.iter().enumerate() {
        if insert_at == Some(i) {
            module.section(&export_section);
        }
        if *id == EXPORT {
            module.section(&export_section);
        } else {
            module.section(&RawSection {
                id: *id,
                data: &wasm[range.clone()],
            });
        }
    }
    if insert_at == Some(layout.sections.len()) {
        module.section(&export_section);
    }
    Ok(module.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wat(text: &str) -> Vec<u8> {
        wat::parse_str(text).expect("valid WAT")
    }

    /// Each way a module could keep state a reset misses is named; a module with only a
    /// memory, globals and a table it never changes has none. The real runtimes' modules are
    /// checked where they are loaded (tests/all/python_pool.rs: their one-shots are reused).
    #[test]
    fn state_beyond_memory_names_what_a_reset_would_miss() {
        let plain = wat(r#"(module (memory 1) (global (mut i32) (i32.const 0))
            (table 2 funcref) (elem (i32.const 0) $f)
            (func $f (call_indirect (i32.const 0)) (global.set 0 (i32.const 1))
                (i32.store (i32.const 0) (i32.const 1))))"#);
        assert_eq!(state_beyond_memory(&plain).unwrap(), Vec::<String>::new());
        for (body, what) in [
            (
                "(table.set (i32.const 1) (ref.null func))",
                "the instruction table.set",
            ),
            (
                "(drop (table.grow (ref.null func) (i32.const 1)))",
                "the instruction table.grow",
            ),
            (
                "(table.fill (i32.const 0) (ref.null func) (i32.const 1))",
                "the instruction table.fill",
            ),
            (
                "(table.copy (i32.const 0) (i32.const 1) (i32.const 1))",
                "the instruction table.copy",
            ),
            (
                "(table.init $e (i32.const 0) (i32.const 0) (i32.const 1))",
                "the instruction table.init",
            ),
            ("(elem.drop $e)", "the instruction elem.drop"),
            ("(data.drop $d)", "the instruction data.drop"),
        ] {
            let m = wat(&format!(
                r#"(module (memory 1) (table 2 funcref) (elem $e func $f) (data $d "x")
                    (func $f {body}))"#
            ));
            assert_eq!(
                state_beyond_memory(&m).unwrap(),
                vec![what.to_string()],
                "{body}"
            );
        }
        let imported = wat(r#"(module (import "e" "t" (table 1 funcref))
            (import "e" "g" (global (mut i32))) (memory 1) (memory 1))"#);
        assert_eq!(
            state_beyond_memory(&imported).unwrap(),
            vec![
                "2 memories".to_string(),
                "an imported global".into(),
                "an imported table".into()
            ]
        );
    }

    /// Names of the module's exports, in order.
    fn export_names(wasm: &[u8]) -> Vec<String> {
        layout(wasm)
            .unwrap()
            .exports
            .into_iter()
            .map(|e| e.0)
            .collect()
    }

    /// Every section but the export section, as bytes.
    fn other_sections(wasm: &[u8]) -> Vec<(u8, Vec<u8>)> {
        layout(wasm)
            .unwrap()
            .sections
            .into_iter()
            .filter(|(id, _)| *id != EXPORT)
            .map(|(id, r)| (id, wasm[r].to_vec()))
            .collect()
    }

    fn compiles(wasm: &[u8]) {
        let engine = wasmtime::Engine::default();
        wasmtime::Module::new(&engine, wasm).expect("the rewritten module is valid");
    }

    #[test]
    fn exports_each_defined_mutable_global_and_copies_the_rest() {
        let wasm = wat(r#"(module
            (import "env" "g" (global $imported (mut i32)))
            (import "env" "f" (func $f))
            (global $a (mut i32) (i32.const 1))
            (global $c i64 (i64.const 2))
            (global $b (mut f64) (f64.const 3))
            (memory (export "memory") 1)
            (func (export "run") call $f)
            (data (i32.const 0) "hi")
            (@custom "trailer" "bytes"))"#);
        let out = export_globals(&wasm).unwrap();
        compiles(&out);
        assert_eq!(
            export_names(&out),
            [
                "memory",
                "run",
                "wasmbox:global:1",
                "wasmbox:global:3",
                "wasmbox:memory"
            ],
            "defined mutable globals only, numbered in the global index space"
        );
        assert_eq!(other_sections(&out), other_sections(&wasm));
        assert_eq!(mutable_globals(&out).unwrap(), [1, 3]);
        assert_eq!(
            export_globals(&out).unwrap(),
            out,
            "a second pass adds nothing"
        );
    }

    #[test]
    fn adds_an_export_section_in_order_when_there_is_none() {
        let wasm = wat(r#"(module
            (global $sp (mut i32) (i32.const 1024))
            (memory 1)
            (func $start global.get $sp drop)
            (start $start)
            (data (i32.const 0) "x")
            (@custom "name-like" "last"))"#);
        assert!(export_names(&wasm).is_empty());
        let out = export_globals(&wasm).unwrap();
        compiles(&out);
        assert_eq!(export_names(&out), ["wasmbox:global:0", "wasmbox:memory"]);
        assert_eq!(other_sections(&out), other_sections(&wasm));
        let ids: Vec<u8> = layout(&out).unwrap().sections.iter().map(|s| s.0).collect();
        let export = ids.iter().position(|&id| id == EXPORT).unwrap();
        assert_eq!(ids[export + 1], 8, "before the start section: {ids:?}");

        // Nothing after the export section's place: it goes before trailing custom sections.
        let wasm = wat(r#"(module (global (mut i32) (i32.const 0)) (@custom "c" "x"))"#);
        let out = export_globals(&wasm).unwrap();
        compiles(&out);
        let ids: Vec<u8> = layout(&out).unwrap().sections.iter().map(|s| s.0).collect();
        assert_eq!(ids, [6, EXPORT, CUSTOM]);
    }

    #[test]
    fn reference_typed_globals_are_exported_too() {
        let wasm = wat(r#"(module
            (global $r (mut funcref) (ref.null func))
            (global $n (mut i32) (i32.const 0)))"#);
        let out = export_globals(&wasm).unwrap();
        compiles(&out);
        assert_eq!(export_names(&out), ["wasmbox:global:0", "wasmbox:global:1"]);
    }

    #[test]
    fn memory_zero_is_marked_even_without_mutable_globals() {
        let wasm = wat(r#"(module (global i32 (i32.const 0)) (func (export "f")))"#);
        assert_eq!(export_globals(&wasm).unwrap(), wasm, "nothing to export");
        let wasm = wat(r#"(module
            (import "env" "memory" (memory 1))
            (global i32 (i32.const 0)))"#);
        let out = export_globals(&wasm).unwrap();
        assert_eq!(export_names(&out), ["wasmbox:memory"]);
        let l = layout(&out).unwrap();
        assert_eq!(l.exports[0].1, ExternalKind::Memory);
        assert_eq!(l.exports[0].2, 0);
    }

    #[test]
    fn a_name_of_ours_taken_by_something_else_is_refused() {
        let wasm = wat(r#"(module
            (global (mut i32) (i32.const 0))
            (func (export "wasmbox:global:0")))"#);
        let err = export_globals(&wasm).unwrap_err().to_string();
        assert!(err.contains("wasmbox:global:0"), "{err}");
        let wasm =
            wat(r#"(module (memory 1) (global (export "wasmbox:memory") i32 (i32.const 0)))"#);
        let err = export_globals(&wasm).unwrap_err().to_string();
        assert!(err.contains("wasmbox:memory"), "{err}");
        assert!(export_globals(b"\0asm\x0d\0\x01\0").is_err(), "a component");
        assert!(export_globals(b"not wasm").is_err());
    }

    #[test]
    fn export_names_parse_back_to_one_index() {
        assert_eq!(parse_global_export_name(&global_export_name(42)), Some(42));
        assert_eq!(parse_global_export_name("wasmbox:global:042"), None);
        assert_eq!(parse_global_export_name("wasmbox:global:"), None);
        assert_eq!(parse_global_export_name("wasmbox:global:x"), None);
        assert_eq!(parse_global_export_name("memory"), None);
    }
}
