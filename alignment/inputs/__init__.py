"""Reading what a user hands a program, as one shared reader: data files, argument files, model and tokenizer
configs, export and adapter files, prompts files, a run's JSONL files. What can be wrong with such a file becomes
one ValueError (InputError, exit 2) naming the file, the line and the key, before anything is built or written:

- the file: missing (FileNotFoundError), a directory, not a regular file (a named pipe or a device never ends),
  larger than the reader's limit;
- how it is stored: gzip bytes under a name without .gz (or a broken .gz), another format's bytes where text is
  expected (Parquet, zip, GGUF, pickle, a CSV named as such), UTF-16 / UTF-32, bytes that are not UTF-8;
- its JSON: a syntax error, nesting deeper than Python's recursion limit, a key given twice (parsers disagree on
  which one wins), a lone UTF-16 surrogate escape (text no encoder can write);
- its typed keys (`Kind`: integer, number, flag, text, lists of them): a boolean is not a number, NaN and
  infinity are not sizes, an integer fits int64 - nothing is coerced.
"""
from alignment.inputs.files import (MAX_INPUT_BYTES, InputError, decode_text, has_lone_surrogate, json_lines,
                                    json_type_name, json_values, other_format, parse_json, read_at_most, read_bytes,
                                    read_json, read_json_object, read_text, where)
from alignment.inputs.keys import (FINITE, FLAG, INT64_MAX, INT64_MIN, NUMBER, POSITIVE_INT, POSITIVE_NUMBER, TEXT,
                                   Kind, check_keys, either, integer, key_problems, list_of, number, short)

__all__ = ["FINITE", "FLAG", "INT64_MAX", "INT64_MIN", "MAX_INPUT_BYTES", "NUMBER", "POSITIVE_INT", "POSITIVE_NUMBER",
           "TEXT", "InputError", "Kind", "check_keys", "decode_text", "either", "has_lone_surrogate", "integer",
           "json_lines", "json_type_name", "json_values", "key_problems", "list_of", "number", "other_format",
           "parse_json", "read_at_most", "read_bytes", "read_json", "read_json_object", "read_text", "short", "where"]
