//! The one table of a dump file's columns, without Arrow: the column names,
//! [`COLUMNS`] and the [`Stats`] of a tensor, one field per statistics column.
//!
//! [`crate::schema`] builds the Arrow schema and the batch builder from the
//! same table (with the `parquet` feature), so a column is declared once.

/// Calls the macro `$then` with the table of every column of a dump file,
/// in file order. Adding a column here adds it to the file, to [`COLUMNS`]
/// and to the batch builder; a statistic also becomes a field of [`Stats`].
/// Then the README's table (checked by `tests/schema_table.rs`) and, for a
/// statistic, the plugin's kernel and bridge row.
macro_rules! for_each_column {
    ($then:ident) => {
        $then! {
            record {
                // The op call, repeated on each of its rows.
                seq           SEQ:           Int64,     required, "Process-wide, unique, increasing in call (entry) order.";
                parent_seq    PARENT_SEQ:    Int64,     null,     "The seq of the nearest recorded enclosing call; null at depth 0.";
                depth         DEPTH:         Int32,     required, "Nesting depth (0: called by the job itself).";
                pid           PID:           Int32,     required, "Process id.";
                thread        THREAD:        Int64,     required, "OS thread id.";
                step          STEP:          Int64,     required, "Training step.";
                phase         PHASE:         Utf8,      required, "`forward`, `backward` or `optimizer`.";
                op            OP:            Utf8,      required, "The op as its schema names it, without the overload.";
                overload      OVERLOAD:      Utf8,      required, "The overload name; `default` for the unnamed one.";
                args          ARGS:          Utf8,      required, "The non-tensor arguments as text.";
                start_ns      START_NS:      Int64,     required, "Epoch time at entry, in nanoseconds.";
                duration_ns   DURATION_NS:   Int64,     required, "Time in the op itself, without opdump's measuring.";
                error         ERROR:         Utf8,      null,     "The message of the exception the op raised, if it raised.";
                module        MODULE:        Utf8,      null,     "The innermost `nn.Module` running the call (its forward's, for a backward call); null outside any.";
                fwd_seq       FWD_SEQ:       Int64,     null,     "Backward calls: the seq of the forward call that made the autograd node being run.";
                source        SOURCE:        Utf8,      null,     "With OPDUMP_SOURCE=1: the innermost line of user code, `file.py:123 in forward`.";
                // The tensor; null from `arg` on in the one row of a call without
                // tensors (role `none`).
                role          ROLE:          Utf8,      required, "`input`, `output`, or `none` for a call without tensors.";
                arg           ARG:           Utf8,      null,     "The schema's argument name, or the return index for results.";
                list_index    LIST_INDEX:    Int32,     null,     "The position inside a `Tensor[]` argument or result.";
                dtype         DTYPE:         Utf8,      null,     "As torch names it without `torch.`: `float32`, `bfloat16`.";
                shape         SHAPE:         Int64List, null,     "Sizes; -1 for a symbolic size.";
                stride        STRIDE:        Int64List, null,     "Strides; empty for a layout without strides.";
                tensor_device TENSOR_DEVICE: Utf8,      null,     "As torch prints it: `cpu`, `cuda:0`.";
                numel         NUMEL:         Int64,     null,     "Number of elements; -1 when symbolic.";
                stats_status  STATS_STATUS:  Utf8,      null,     "Why the statistics are what they are (see `StatsStatus`).";
                name          NAME:          Utf8,      null,     "The parameter or buffer this tensor is (`h.3.mlp.c_fc.weight`), or its `.grad`.";
                capture_file  CAPTURE_FILE:  Utf8,      null,     "In a call OPDUMP_CAPTURE chose: the safetensors file in the same directory holding the tensor.";
                capture_key   CAPTURE_KEY:   Utf8,      null,     "In a call OPDUMP_CAPTURE chose: the tensor's key in that file (`input.self`, `output.0`).";
                fingerprint   FINGERPRINT:   UInt64,    null,     "A 64-bit hash of the values in logical order, the same on every device (README: Fingerprint and sketch); null where not measured.";
                sketch        SKETCH:        Float64List, null,   "K random +-1 projections of the values, float64 (README: Fingerprint and sketch); null where not measured.";
            }
            float_stats {
                min           MIN:           "The smallest finite element.";
                max           MAX:           "The largest finite element.";
                mean          MEAN:          "The mean of the finite elements.";
                std           STD:           "The population standard deviation of the finite elements.";
                l2            L2:            "The Euclidean norm of the finite elements (0 when there is none).";
                absmax        ABSMAX:        "The largest magnitude of a finite element.";
            }
            count_stats {
                nan_count     NAN_COUNT:     "Elements that are NaN.";
                posinf_count  POSINF_COUNT:  "Elements that are +Inf.";
                neginf_count  NEGINF_COUNT:  "Elements that are -Inf.";
                zero_count    ZERO_COUNT:    "Elements equal to zero (either sign).";
            }
        }
    };
}
#[cfg(feature = "parquet")] // schema.rs builds the batch builder from it
pub(crate) use for_each_column;

/// The Arrow type of a column, in a form a `const` table can hold
/// (`DataType::List` owns an `Arc`, so a `DataType` cannot be a constant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColType {
    Int32,
    Int64,
    Float64,
    /// Fingerprints.
    UInt64,
    Utf8,
    /// A list of int64: shapes and strides.
    Int64List,
    /// A list of float64: sketches.
    Float64List,
}

/// One column of a dump file, as [`COLUMNS`] declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnDef {
    pub name: &'static str,
    pub ty: ColType,
    pub nullable: bool,
    /// One line: what the column holds.
    pub doc: &'static str,
}

macro_rules! is_nullable {
    (null) => {
        true
    };
    (required) => {
        false
    };
}

/// Generates, from the table and in its order: the `col` name constants,
/// [`COLUMNS`] and the [`Stats`] struct.
macro_rules! declare_columns {
    (
        record {
            $( $name:ident $CONST:ident: $ty:ident, $null:ident, $doc:literal; )*
        }
        float_stats {
            $( $fname:ident $FCONST:ident: $fdoc:literal; )*
        }
        count_stats {
            $( $cname:ident $CCONST:ident: $cdoc:literal; )*
        }
    ) => {
        /// Column names, for readers.
        pub mod col {
            $( #[doc = $doc] pub const $CONST: &str = stringify!($name); )*
            $( #[doc = $fdoc] pub const $FCONST: &str = stringify!($fname); )*
            $( #[doc = $cdoc] pub const $CCONST: &str = stringify!($cname); )*
        }

        /// Every column of a dump file, in file order. The statistics
        /// columns are float64 and int64, null when not measured.
        pub const COLUMNS: &[ColumnDef] = &[
            $( ColumnDef {
                name: stringify!($name),
                ty: ColType::$ty,
                nullable: is_nullable!($null),
                doc: $doc,
            }, )*
            $( ColumnDef {
                name: stringify!($fname),
                ty: ColType::Float64,
                nullable: true,
                doc: $fdoc,
            }, )*
            $( ColumnDef {
                name: stringify!($cname),
                ty: ColType::Int64,
                nullable: true,
                doc: $cdoc,
            }, )*
        ];

        /// The float64 statistics columns, in file order: a reader that
        /// decodes them takes this list, so a new one is not forgotten.
        pub const FLOAT_STATS: &[&str] = &[ $( col::$FCONST, )* ];

        /// The int64 element-count columns, in file order.
        pub const COUNT_STATS: &[&str] = &[ $( col::$CCONST, )* ];

        /// Each `col` constant's identifier and value, to test that one is
        /// the other in capitals.
        #[cfg(test)]
        const COL_IDENTS: &[(&str, &str)] = &[
            $( (stringify!($CONST), col::$CONST), )*
            $( (stringify!($FCONST), col::$FCONST), )*
            $( (stringify!($CCONST), col::$CCONST), )*
        ];

        /// Statistics over the finite elements of a tensor, in float64: one
        /// field per statistics column, of the same name.
        ///
        /// A value that does not exist (the min of a tensor with no finite
        /// element) is NaN here and null in the file.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct Stats {
            $( #[doc = $fdoc] pub $fname: f64, )*
            $( #[doc = $cdoc] pub $cname: i64, )*
        }

        impl Stats {
            /// No values: what an unmeasured tensor carries.
            pub const NONE: Stats = Stats {
                $( $fname: f64::NAN, )*
                $( $cname: 0, )*
            };
        }
    };
}

for_each_column!(declare_columns);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn col_constants_are_the_names_in_capitals() {
        for (ident, name) in COL_IDENTS {
            assert_eq!(ident.to_ascii_lowercase(), *name);
        }
        assert_eq!(COL_IDENTS.len(), COLUMNS.len());
    }

    #[test]
    fn names_are_unique_and_docs_one_line() {
        for (i, c) in COLUMNS.iter().enumerate() {
            assert!(
                COLUMNS[..i].iter().all(|d| d.name != c.name),
                "{} twice",
                c.name
            );
            assert!(
                !c.doc.is_empty() && !c.doc.contains('\n'),
                "{}: {:?}",
                c.name,
                c.doc
            );
        }
    }
}
