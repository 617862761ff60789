// The object store on disk (--data-dir): every object is a file DIR/bucket/key with its metadata in
// DIR/.ferry/meta/bucket/key; multipart parts wait in DIR/.ferry/uploads/ID/N. A file is written
// whole under DIR/.ferry/tmp, then renamed in place under the store's lock, so the files always
// match the objects the store lists. At start the store lists what it finds there; the bytes stay
// on disk until a request reads them.
#include <fcntl.h>

#include "common/json.h"
#include "objects/store_server_impl.h"

namespace ferry::objects {

namespace {

constexpr int kMetadataVersion = 1;
constexpr size_t kCopyChunk = size_t{1} << 20;

// Closes a descriptor when it leaves scope.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

Status writeFailed(const std::string& what, int err) {
  if (err == ENOSPC || err == EDQUOT)
    return Status(StatusCode::kResourceExhausted, "the data directory is full (" + what + ")", err);
  return ioError(what, err);
}

}  // namespace

fs::path ObjectStore::Impl::fileOf(const std::string& bucket, const std::string& key) const {
  return fs::path(opts.dataDir) / bucket / key;
}

fs::path ObjectStore::Impl::metaOf(const std::string& bucket, const std::string& key) const {
  return fs::path(opts.dataDir) / ".ferry" / "meta" / bucket / key;
}

fs::path ObjectStore::Impl::partOf(const std::string& uploadId, uint32_t partNumber) const {
  return fs::path(opts.dataDir) / ".ferry" / "uploads" / uploadId / std::to_string(partNumber);
}

Result<fs::path> ObjectStore::Impl::writeTemporary(const std::function<Status(int fd)>& fill,
                                                   uint64_t* inode) {
  std::string name = (fs::path(opts.dataDir) / ".ferry" / "tmp" / "XXXXXX").string();
  int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return writeFailed("cannot create a file in " + opts.dataDir + "/.ferry/tmp", errno);
  FdCloser closer{fd};
  Status st = fill(fd);
  struct stat sb {};
  if (st.isOk() && ::fstat(fd, &sb) != 0) st = ioError("fstat " + name);
  if (!st.isOk()) {
    ::unlink(name.c_str());
    return st;
  }
  if (inode) *inode = sb.st_ino;
  return fs::path(name);
}

Status ObjectStore::Impl::writeMemory(int fd, const void* data, uint64_t size) {
  const char* p = static_cast<const char*>(data);
  for (uint64_t done = 0; done < size;) {
    ssize_t n = ::write(fd, p + done, std::min<uint64_t>(size - done, uint64_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return writeFailed("writing an object", n < 0 ? errno : EIO);
    done += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

Status ObjectStore::Impl::copyFiles(int out, const std::vector<int>& from, Md5* hash) {
  std::vector<char> buf;  // when the bytes are hashed, or copy_file_range is refused
  if (hash) buf.resize(kCopyChunk);
  for (int in : from) {
    for (;;) {
      ssize_t n = 0;
      if (buf.empty()) {
        // Inside the kernel (or by sharing blocks); a file system that cannot is copied through a
        // buffer instead.
        n = ::copy_file_range(in, nullptr, out, nullptr, kCopyChunk, 0);
        if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
          buf.resize(kCopyChunk);
          continue;
        }
      } else {
        n = ::read(in, buf.data(), buf.size());
        if (n > 0) {
          if (hash) hash->update(buf.data(), static_cast<size_t>(n));
          FERRY_RETURN_IF_ERROR(writeMemory(out, buf.data(), static_cast<uint64_t>(n)));
        }
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return writeFailed("copying an object's file", errno);
      if (n == 0) break;
    }
  }
  return Status::ok();
}

ObjectPtr ObjectStore::Impl::recordOf(const ObjectPtr& o, uint64_t inode) {
  auto r = std::make_shared<StoredObject>();
  r->server = o->server;
  r->size = o->size;
  r->etag = o->etag;
  r->modifiedNs = o->modifiedNs;
  r->contentType = o->contentType;
  r->meta = o->meta;
  r->md5 = o->md5;
  r->onDisk = true;
  r->inode = inode;
  if (o->mem != nullptr) r->cached = o;
  return r;
}

Result<fs::path> ObjectStore::Impl::writeMetadata(const ObjectPtr& record) {
  json::Value meta = json::Value::emptyArray();
  for (const auto& [name, value] : record->meta) meta.push(json::Array{name, value});
  json::Value doc(json::Object{{"version", kMetadataVersion},
                               {"size", std::to_string(record->size)},
                               {"etag", record->etag},
                               {"modified_ns", record->modifiedNs},
                               {"content_type", record->contentType},
                               {"meta", std::move(meta)}});
  const std::string text = json::serialize(doc);
  return writeTemporary([&](int fd) { return writeMemory(fd, text.data(), text.size()); }, nullptr);
}

Status ObjectStore::Impl::installLocked(const std::string& bucket, const std::string& key,
                                        const fs::path& data, const fs::path& meta) {
  std::error_code ec;
  const fs::path file = fileOf(bucket, key), metaFile = metaOf(bucket, key);
  fs::create_directories(file.parent_path(), ec);
  fs::create_directories(metaFile.parent_path(), ec);
  fs::rename(data, file, ec);
  if (ec) {
    fs::remove(data, ec);
    fs::remove(meta, ec);
    return Status(StatusCode::kIoError, "cannot store the object as " + file.string() + ": " + ec.message());
  }
  fs::rename(meta, metaFile, ec);
  if (ec) fs::remove(meta, ec);  // load() then takes what the file itself tells
  return Status::ok();
}

void ObjectStore::Impl::removeFilesLocked(const std::string& bucket, const std::string& key) {
  if (!onDisk() || !validKey(key)) return;
  std::error_code ec;
  fs::remove(fileOf(bucket, key), ec);
  fs::remove(metaOf(bucket, key), ec);
}

Result<int> ObjectStore::Impl::openFile(const fs::path& file, uint64_t inode) const {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ioError("cannot open " + file.string());
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || sb.st_ino != inode) {
    ::close(fd);
    return Status(StatusCode::kBusy, "the object was replaced while it was read");
  }
  return fd;
}

Result<int> ObjectStore::Impl::openRecord(const std::string& bucket, const std::string& key,
                                          const ObjectPtr& record) const {
  return openFile(fileOf(bucket, key), record->inode);
}

namespace {

// What is written beside an object.
struct SavedMetadata {
  std::string etag;
  int64_t modifiedNs = 0;
  std::string contentType;
  UserMetadata meta;
};

// The metadata written beside an object; nullopt when it is missing, malformed, or of another
// size than the file (a file changed by hand).
std::optional<SavedMetadata> readMetadata(const fs::path& file, uint64_t size) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto doc = json::parse(text);
  if (!doc.isOk()) return std::nullopt;
  const json::Value *version = doc->find("version"), *sz = doc->find("size"), *etag = doc->find("etag"),
                    *modified = doc->find("modified_ns"), *type = doc->find("content_type"),
                    *meta = doc->find("meta");
  if (!version || !sz || !etag || !modified || !type || !meta || !meta->array()) return std::nullopt;
  auto v = version->getInt();
  auto s = sz->getString();
  auto e = etag->getString();
  auto m = modified->getInt();
  auto t = type->getString();
  if (!v.isOk() || *v != kMetadataVersion || !s.isOk() || number(std::string(*s)) != size || !e.isOk() ||
      !m.isOk() || !t.isOk())
    return std::nullopt;
  SavedMetadata out;
  out.etag = std::string(*e);
  out.modifiedNs = *m;
  out.contentType = std::string(*t);
  for (const json::Value& pair : *meta->array()) {
    const json::Array* kv = pair.array();
    if (!kv || kv->size() != 2 || !(*kv)[0].getString().isOk() || !(*kv)[1].getString().isOk())
      return std::nullopt;
    out.meta.emplace_back(std::string(*(*kv)[0].getString()), std::string(*(*kv)[1].getString()));
  }
  return out;
}

// S3's ETag of a file's bytes (the quoted hex of their MD5), read in pieces.
Result<std::string> etagOfFile(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return ioError("cannot read " + file.string());
  Md5 md5;
  std::vector<char> buf(kCopyChunk);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    md5.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return ioError("cannot read " + file.string());
  return "\"" + agent::hexOf(md5.digest()) + "\"";
}

}  // namespace

Status ObjectStore::Impl::load() {
  if (!onDisk()) return Status::ok();
  std::error_code ec;
  fs::create_directories(opts.dataDir, ec);
  if (!fs::is_directory(opts.dataDir))
    return Status(StatusCode::kIoError, opts.dataDir + " is not a directory");
  // Uploads in progress and temporary files do not outlive the process that wrote them.
  const fs::path own = fs::path(opts.dataDir) / ".ferry";
  fs::remove_all(own / "uploads", ec);
  fs::remove_all(own / "tmp", ec);
  for (const char* sub : {"meta", "uploads", "tmp"}) {
    fs::create_directories(own / sub, ec);
    if (ec)
      return Status(StatusCode::kIoError, "cannot create " + (own / sub).string() + ": " + ec.message());
  }
  for (const auto& b : fs::directory_iterator(opts.dataDir, ec)) {
    if (b.is_directory() && validBucket(b.path().filename().string()))
      FERRY_RETURN_IF_ERROR(loadBucket(b.path()));
  }
  if (ec) return Status(StatusCode::kIoError, "cannot list " + opts.dataDir + ": " + ec.message());
  return Status::ok();
}

Status ObjectStore::Impl::loadBucket(const fs::path& dir) {
  const std::string bucket = dir.filename().string();
  std::map<std::string, ObjectPtr>& objects = buckets[bucket];
  bucketCreated[bucket] = nowNs();
  std::error_code ec;
  for (const auto& f : fs::recursive_directory_iterator(dir, ec)) {
    if (!f.is_regular_file()) continue;
    const std::string key = fs::relative(f.path(), dir).generic_string();
    if (!validKey(key)) continue;
    struct stat sb {};
    if (::stat(f.path().c_str(), &sb) != 0) return ioError("cannot stat " + f.path().string());
    auto record = std::make_shared<StoredObject>();
    record->server = rdma.get();
    record->size = static_cast<uint64_t>(sb.st_size);
    record->onDisk = true;
    record->inode = sb.st_ino;
    if (auto meta = readMetadata(metaOf(bucket, key), record->size)) {
      record->etag = std::move(meta->etag);
      record->modifiedNs = meta->modifiedNs;
      record->contentType = std::move(meta->contentType);
      record->meta = std::move(meta->meta);
    } else {  // a file put there by hand: its MD5 and its time
      FERRY_ASSIGN_OR_RETURN(record->etag, etagOfFile(f.path()));
      record->modifiedNs = int64_t{sb.st_mtim.tv_sec} * 1000000000 + sb.st_mtim.tv_nsec;
    }
    objects[key] = std::move(record);
  }
  if (ec) return Status(StatusCode::kIoError, "cannot list " + dir.string() + ": " + ec.message());
  return Status::ok();
}

}  // namespace ferry::objects
