// The object store's persistence: objects as files under --data-dir, written on commit and
// loaded at start.
#include "objects/store_server_impl.h"

namespace ferry::objects {

fs::path ObjectStore::Impl::fileOf(const std::string& bucket, const std::string& key) const {
  return fs::path(opts.dataDir) / bucket / key;
}

Status ObjectStore::Impl::persist(const std::string& bucket, const std::string& key, const ObjectPtr& o) {
  if (opts.dataDir.empty()) return Status::ok();
  fs::path file = fileOf(bucket, key);
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  fs::path tmp = file;
  tmp += ".ferry-tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (o->size) out.write(static_cast<const char*>(o->mem), static_cast<std::streamsize>(o->size));
    if (!out) return Status(StatusCode::kIoError, "cannot write " + tmp.string());
  }
  fs::rename(tmp, file, ec);
  if (ec) return Status(StatusCode::kIoError, "cannot rename " + tmp.string() + ": " + ec.message());
  return Status::ok();
}

Status ObjectStore::Impl::load() {
  if (opts.dataDir.empty()) return Status::ok();
  std::error_code ec;
  fs::create_directories(opts.dataDir, ec);
  if (!fs::is_directory(opts.dataDir))
    return Status(StatusCode::kIoError, opts.dataDir + " is not a directory");
  for (const auto& b : fs::directory_iterator(opts.dataDir, ec)) {
    if (!b.is_directory()) continue;
    std::string bucket = b.path().filename().string();
    if (!validBucket(bucket)) continue;
    buckets[bucket];
    bucketCreated[bucket] = nowNs();
    for (const auto& f : fs::recursive_directory_iterator(b.path(), ec)) {
      if (!f.is_regular_file()) continue;
      std::string key = fs::relative(f.path(), b.path()).generic_string();
      if (key.size() > 10 && key.substr(key.size() - 10) == ".ferry-tmp") continue;
      if (!validKey(key)) continue;
      auto o = newObject(f.file_size());
      if (!o.isOk()) return o.status();
      memory.fetch_add((*o)->size);  // loaded whatever the bound: it was stored before
      (*o)->memory = BoundShare(&memory, (*o)->size);
      std::ifstream in(f.path(), std::ios::binary);
      if ((*o)->size) in.read(static_cast<char*>((*o)->mem), static_cast<std::streamsize>((*o)->size));
      if (!in) return Status(StatusCode::kIoError, "cannot read " + f.path().string());
      (*o)->etag = etagOf(*o);
      buckets[bucket][key] = *o;
    }
  }
  return Status::ok();
}

}  // namespace ferry::objects
