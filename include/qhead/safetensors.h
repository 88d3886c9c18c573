// qhead/safetensors.h — safetensors read (mmap, validated) and write (atomic).
//
// Format: u64 little-endian header length N, N bytes of UTF-8 JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the data section; offsets are relative to the data section start.
//
// Reading validates everything before any tensor is handed out: header length
// against the file size and a cap (100 MB), a header that starts with '{',
// well-formed JSON object nested at most 16 deep, known
// dtypes, non-negative shapes, shape × dtype size == byte range, ranges inside
// the data section, and the ranges tile the data section exactly (no overlap,
// no hole), as the reference implementation requires; __metadata__ maps
// strings to strings. Every failure throws qhead::Error(kInvalidFile) naming
// the file and the tensor (file-supplied names escaped: qhead never prints
// raw header bytes).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qhead/tensor.h"

namespace qhead {

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws Error (kIo / kInvalidFile); anything
  // but a regular file (a directory, FIFO, device) is refused without opening
  // it for reading.
  static SafetensorsFile open(const std::string& path);
  // Validates a safetensors image of `size` bytes at `bytes` (which the
  // returned file and its tensors keep alive); `name` stands for the path in
  // error messages. The same checks and errors as open().
  static SafetensorsFile from_bytes(std::shared_ptr<const void> bytes, size_t size, const std::string& name);

  const std::string& path() const { return path_; }
  // Tensor names in file order (by data offset).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // A read-only view into the mapping; the returned Tensor keeps it alive.
  // Throws kInvalidArgument naming the file if the tensor is absent.
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return file_size_; }

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    size_t begin, end;  // relative to data section
  };
  std::string path_;
  std::shared_ptr<const void> mapping_;  // whole file
  size_t file_size_ = 0;
  size_t data_start_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, Entry> index_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors, then writes them to a temporary file beside `path`
// (`.NAME.qhead-tmp-PID`) and renames it into place, so a reader never sees a
// half-written file. Refuses
// to write over any file named in `forbid` (the inputs) — compared by inode.
class SafetensorsWriter {
 public:
  // Adds a tensor (CPU, contiguous). The data is copied at write() time, so
  // the view must stay valid until then. Duplicate names are an error.
  void add(const std::string& name, const TensorView& t);
  void set_metadata(const std::string& key, const std::string& value);
  // `check`, when given, is called with the temporary file's path once it is
  // complete and synced, before the rename: if it throws, the temporary is
  // removed and `path` is left as it was. `path` must be absent, a regular
  // file, or a link to one (a FIFO, device or directory there is refused).
  void write(const std::string& path, const std::vector<std::string>& forbid = {},
             const std::function<void(const std::string& written)>& check = {}) const;

 private:
  std::vector<std::pair<std::string, TensorView>> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace qhead
