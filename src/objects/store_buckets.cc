// The object store's buckets and listings: ListBuckets, ListObjects (V1 and V2) and
// DeleteObjects.
#include "objects/store_server_impl.h"

namespace ferry::objects {

void ObjectStore::Impl::listBuckets(httplib::Response& res) {
  std::string xml =
      std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListAllMyBucketsResult xmlns=\"") + kXmlNs +
      "\"><Owner><ID>ferry</ID><DisplayName>ferry</DisplayName></Owner><Buckets>";
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [name, objects] : buckets) {
      xml += "<Bucket><Name>" + xmlEscape(name) + "</Name><CreationDate>" + isoTime(bucketCreated[name]) +
             "</CreationDate></Bucket>";
    }
  }
  xml += "</Buckets></ListAllMyBucketsResult>";
  res.status = 200;
  res.set_content(xml, "application/xml");
}

void ObjectStore::Impl::listObjects(const httplib::Request& req, httplib::Response& res,
                                    const std::string& bucket) {
  const bool v2 = req.get_param_value("list-type") == "2";
  // encoding-type=url: keys and prefixes are percent-encoded (they may hold bytes XML cannot).
  const bool urlEncoded = req.get_param_value("encoding-type") == "url";
  auto text = [&](const std::string& s) { return urlEncoded ? uriEncode(s, true) : xmlEscape(s); };
  const std::string prefix = req.get_param_value("prefix");
  const std::string delimiter = req.get_param_value("delimiter");
  std::string after = v2 ? (req.has_param("continuation-token") ? req.get_param_value("continuation-token")
                                                                : req.get_param_value("start-after"))
                         : req.get_param_value("marker");
  uint64_t maxKeys = 1000;
  if (req.has_param("max-keys")) {
    auto m = number(req.get_param_value("max-keys"));
    if (!m) return error(res, 400, "InvalidArgument", "max-keys must be a number", req.path);
    maxKeys = std::min<uint64_t>(*m, 1000);
  }
  ListingPage page;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto b = buckets.find(bucket);
    if (b == buckets.end()) return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
    if (req.method == "HEAD") {
      res.status = 200;
      return;
    }
    page = listPage(b->second, after, prefix, delimiter, maxKeys, urlEncoded);
  }
  const auto& [contents, prefixes, last, count, truncated] = page;
  std::string xml = std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"") +
                    kXmlNs + "\"><Name>" + xmlEscape(bucket) + "</Name><Prefix>" + text(prefix) + "</Prefix>";
  if (!delimiter.empty()) xml += "<Delimiter>" + text(delimiter) + "</Delimiter>";
  if (urlEncoded) xml += "<EncodingType>url</EncodingType>";
  xml += "<MaxKeys>" + std::to_string(maxKeys) + "</MaxKeys><IsTruncated>" + (truncated ? "true" : "false") +
         "</IsTruncated>";
  if (v2) {
    xml += "<KeyCount>" + std::to_string(count) + "</KeyCount>";
    if (req.has_param("continuation-token")) {
      xml += "<ContinuationToken>" + xmlEscape(req.get_param_value("continuation-token")) +
             "</ContinuationToken>";
    }
    if (truncated) xml += "<NextContinuationToken>" + xmlEscape(last) + "</NextContinuationToken>";
  } else {
    xml += "<Marker>" + text(after) + "</Marker>";
    if (truncated) xml += "<NextMarker>" + text(last) + "</NextMarker>";
  }
  xml += contents + prefixes + "</ListBucketResult>";
  res.status = 200;
  res.set_content(xml, "application/xml");
}

// One page of a listing: keys after `after` under `prefix`, those with `delimiter` past the prefix
// rolled up into common prefixes, at most maxKeys entries in all. The caller holds mu.
ObjectStore::Impl::ListingPage ObjectStore::Impl::listPage(const std::map<std::string, ObjectPtr>& keys,
                                                           const std::string& after,
                                                           const std::string& prefix,
                                                           const std::string& delimiter, uint64_t maxKeys,
                                                           bool urlEncoded) {
  auto text = [&](const std::string& s) { return urlEncoded ? uriEncode(s, true) : xmlEscape(s); };
  ListingPage page;
  auto& [contents, prefixes, last, count, truncated] = page;
  std::string lastPrefix;
  for (auto it = after.empty() ? keys.begin() : keys.upper_bound(after); it != keys.end(); ++it) {
    const std::string& key = it->first;
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    if (!delimiter.empty()) {
      size_t d = key.find(delimiter, prefix.size());
      if (d != std::string::npos) {
        std::string cp = key.substr(0, d + delimiter.size());
        if (cp == lastPrefix) continue;
        if (count == maxKeys) {
          truncated = true;
          break;
        }
        lastPrefix = cp;
        prefixes += "<CommonPrefixes><Prefix>" + text(cp) + "</Prefix></CommonPrefixes>";
        ++count;
        last = key;
        continue;
      }
    }
    if (count == maxKeys) {
      truncated = true;
      break;
    }
    const ObjectPtr& o = it->second;
    contents += "<Contents><Key>" + text(key) + "</Key><LastModified>" + isoTime(o->modifiedNs) +
                "</LastModified><ETag>" + xmlEscape(o->etag) + "</ETag><Size>" + std::to_string(o->size) +
                "</Size><StorageClass>STANDARD</StorageClass></Contents>";
    ++count;
    last = key;
  }
  return page;
}

void ObjectStore::Impl::deleteObjects(const httplib::Request& req, httplib::Response& res,
                                      const std::string& bucket, const std::string& body) {
  auto [request, refusal] = decideDeleteObjects(body);
  if (refusal) return error(res, refusal->status, refusal->code, refusal->message, req.path);
  std::string entries;
  std::vector<ObjectPtr> removed;  // freed outside mu
  {
    std::lock_guard<std::mutex> lock(mu);
    auto b = buckets.find(bucket);
    if (b == buckets.end()) return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
    for (const std::string& key : request.keys) {
      if (!validKey(key)) {  // no such object can exist; S3 answers per key
        entries += "<Error><Key>" + xmlEscape(key) +
                   "</Key><Code>InvalidArgument</Code><Message>not a valid key</Message></Error>";
        continue;
      }
      auto it = b->second.find(key);
      if (it != b->second.end()) {
        forgetLocked(it->second);
        removed.push_back(it->second);
        b->second.erase(it);
      }
      removeFilesLocked(bucket, key);
      if (!request.quiet)
        entries += "<Deleted><Key>" + xmlEscape(key) + "</Key></Deleted>";  // S3: present or not
    }
  }
  res.status = 200;
  res.set_content(xmlHead("DeleteResult") + entries + "</DeleteResult>", "application/xml");
}

}  // namespace ferry::objects
