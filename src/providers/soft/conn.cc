#include "providers/soft/conn.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "common/device_access.h"
#include "common/log.h"
#include "providers/soft/region_copy.h"

namespace ferry::soft {
namespace {

constexpr size_t kStagingBytes = 256 * 1024;
// Payloads at least this large (beyond what is staged) are read straight into place.
constexpr size_t kDirectReadMin = 16 * 1024;
// What a read takes after a frame whose payload was large: a header, and the start of what follows.
constexpr size_t kHeaderWindowBytes = 4 * 1024;
constexpr int kMaxIov = 64;
constexpr size_t kZeroBytes = 64 * 1024;
const uint8_t kZeros[kZeroBytes] = {};
std::atomic<uint64_t> largeStagedCount{0};

}  // namespace

// The iovec of one write: frames' pieces, the first `skip` bytes (already sent) left out.
struct IovBuilder {
  iovec iov[kMaxIov];
  int count = 0;
  size_t skip = 0;
  bool stopped = false;  // the output staging buffer is full: what follows waits for the next write

  bool full() const { return count == kMaxIov || stopped; }
  void add(const uint8_t* p, size_t len) {
    if (skip >= len) {
      skip -= len;
      return;
    }
    p += skip;
    len -= skip;
    skip = 0;
    if (count < kMaxIov && len > 0) iov[count++] = {const_cast<uint8_t*>(p), len};
  }
  // len zero bytes (a deregistered region's, never read); false when they did not all fit.
  bool addZeros(size_t len) {
    size_t done = 0;
    while (done < len && count < kMaxIov) {
      const size_t piece = std::min(kZeroBytes, len - done);
      if (skip >= piece) {
        skip -= piece;
      } else {
        iov[count++] = {const_cast<uint8_t*>(kZeros + skip), piece - skip};
        skip = 0;
      }
      done += piece;
    }
    return done == len;
  }
};

uint64_t largePayloadBytesStaged() { return largeStagedCount.load(std::memory_order_relaxed); }

template <typename Other>
void OutFrame::assignFrom(Other&& o) {
  headerLen = o.headerLen;
  std::memcpy(header, o.header, headerLen);
  payload = std::forward<Other>(o).payload;
  ownedPayload = std::forward<Other>(o).ownedPayload;
  hasTrailer = o.hasTrailer;
  trailer = o.trailer;
  revoked = o.revoked;
  seq = o.seq;
  sent = o.sent;
}

OutFrame& OutFrame::operator=(OutFrame&& o) noexcept {
  if (this != &o) assignFrom(std::move(o));
  return *this;
}

OutFrame& OutFrame::operator=(const OutFrame& o) {
  if (this != &o) assignFrom(o);
  return *this;
}

size_t OutFrame::total() const {
  size_t payloadBytes = ownedPayload.size();
  for (const auto& s : payload) payloadBytes += s.length;
  return headerLen + payloadBytes + (hasTrailer ? 4 : 0);
}

Conn::Conn(SoftContext* ctx, std::unique_ptr<Link> link, Delegate* delegate, Reactor* reactor)
    : ctx_(ctx),
      reactor_(reactor ? reactor : &ctx->reactor()),
      link_(std::move(link)),
      delegate_(delegate),
      staged_(new uint8_t[kStagingBytes]) {}

Conn::~Conn() {
  // Every owner closes its connections before it lets them go. One that let an open connection go
  // on the loop would leave its link watched after its descriptors close (a caller's polls kept
  // waking, and a later fd of that number finding the stale entry): the link is detached, and the
  // slip said. Anywhere else the loop is stopped, and its set gone with it.
  if (!closed_ && reactor_->inLoop()) {
    FERRY_LOG(kWarn, "a connection was let go while open on its loop: its link is detached");
    link_->detach();
  }
}

Status Conn::attach() {
  FERRY_RETURN_IF_ERROR(link_->attach(*reactor_, weak_from_this()));
  if (link_->pollable() && reactor_ == &ctx_->reactor()) ctx_->addAttendedLinkFromLoop(shared_from_this());
  return Status::ok();
}

void Conn::moveTo(Reactor* to) {
  if (closed() || to == reactor_) return;
  detachLink();
  reactor_ = to;
  to->post([self = shared_from_this()] {
    if (self->closed()) return;
    if (Status st = self->link_->attach(*self->reactor_, self); !st.isOk()) {
      self->close(st);
      return;
    }
    self->resumeInput();
    if (!self->out_.empty()) self->flush();
  });
}

void Conn::detachLink() {
  if (link_->pollable() && reactor_ == &ctx_->reactor()) ctx_->removeAttendedLinkFromLoop(this);
  link_->detach();
}

void Conn::pauseInput() {
  if (paused_ || closed()) return;
  paused_ = true;
  link_->pauseReading(true);
}

void Conn::resumeInput() {
  if (!paused_ || closed()) return;
  paused_ = false;
  // From the loop, after the step that resumes us: never inside another connection's (or our
  // own) reading, which could come back here.
  std::weak_ptr<Conn> weak = weak_from_this();
  reactor_->post([weak] {
    if (auto self = weak.lock()) self->continueAfterPause();
  });
}

void Conn::continueAfterPause() {
  if (closed() || paused_) return;
  link_->pauseReading(false);
  cork();
  if (headerPending_) {
    headerPending_ = false;
    beginFrame();
  }
  if (!closed() && !paused_) consumeStaged();
  if (closed()) return;
  // Paused again: this step is over, as onReadable's is when it pauses (and it says so the same way).
  if (paused_ && delegate_) delegate_->onInputDrained(*this);
  if (closed()) return;
  uncork();
  if (!closed() && !paused_) takeInput();
}

void Conn::onLinkConnected(const Status& result) {
  auto self = shared_from_this();  // a delegate may drop its reference while we run
  if (!result.isOk()) {
    close(result);
    return;
  }
  link_->wantWritable(wantWrite_);
  if (delegate_) delegate_->onConnected(*this);
  if (closed()) return;
  flush();
}

void Conn::onLinkReadable() { onReadable(); }

void Conn::onLinkWritable() {
  if (!closed()) flush();
}

void Conn::onLinkBroken(const Status& why) { close(why); }

void Conn::takeInput() {
  auto self = shared_from_this();
  onReadable();
  if (!closed()) flush();
}

void Conn::attend(int64_t untilNs) {
  if (!closed()) link_->attend(untilNs);
}

bool Conn::pollInput() {
  if (closed() || (!link_->pending() && !link_->prepareToSleep(/*spin=*/false))) return false;
  takeInput();
  return true;
}

void Conn::sendHeader(const wire::FrameHeader& header) {
  OutFrame frame;
  frame.headerLen = static_cast<uint16_t>(wire::encodeHeader(header, frame.header));
  frame.seq = header.seq;
  send(std::move(frame));
}

void Conn::send(OutFrame frame) {
  if (closed()) return;
  out_.push_back(std::move(frame));
  if (!wantWrite_ && !link_->connecting() && corks_ == 0) flush();
}

void Conn::uncork() {
  if (corks_ > 0) --corks_;
  if (corks_ == 0 && !closed() && !wantWrite_ && !link_->connecting() && !out_.empty()) flush();
}

void Conn::dropUnsentFrames() {
  while (!out_.empty() && out_.back().sent == 0) out_.pop_back();
}

void Conn::close(const Status& why, bool quiet) {
  if (closed()) return;
  auto self = shared_from_this();
  detachLink();
  link_->close();
  closed_ = true;
  out_.clear();
  if (closeTimer_ != 0) reactor_->cancelTimer(std::exchange(closeTimer_, 0));  // `self` keeps us meanwhile
  if (!quiet && delegate_) delegate_->onClosed(*this, why);
}

void Conn::closeAfterFlush(bool drain) {
  if (closed()) return;
  drainOnClose_ = drainOnClose_ || drain;
  closeAfterFlush_ = true;
  if (closeTimer_ == 0) {
    // A peer that neither reads what is queued nor closes its side is given up on.
    closeTimer_ = reactor_->addTimer(Reactor::Clock::now() + kCloseAfterFlushLimit,
                                     [self = shared_from_this()] { self->close(Status::ok(), true); });
  }
  if (out_.empty()) {
    if (drainOnClose_) {
      startDrain();
    } else {
      close(Status::ok(), true);
    }
  }
}

void Conn::startDrain() {
  if (draining_ || closed()) return;
  draining_ = true;
  if (paused_) {
    paused_ = false;  // what still comes is discarded, not held
    link_->pauseReading(false);
  }
  link_->shutdownWrite();
  // The drain ends when the peer closes, or at the latest with closeAfterFlush's timer.
}

void Conn::flush() {
  if (closed() || link_->connecting()) return;
  std::vector<uint32_t> revokedSeqs;
  while (!out_.empty()) {
    IovBuilder out;
    ssize_t n;
    {
      std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
      gatherLocked(out, &revokedSeqs);
      n = out.count == 0 ? 0 : link_->writev(out.iov, out.count);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wantWrite_) {
          wantWrite_ = true;
          link_->wantWritable(true);
        }
        break;
      }
      close(ioError("send"));
      return;
    }
    if (n > 0) reactor_->noteWork(static_cast<size_t>(n));
    if (n > 0 && delegate_) delegate_->onProgress(*this);
    consumeSent(static_cast<size_t>(n));
    if (out.count == 0) break;
  }
  if (out_.empty() && wantWrite_) {
    wantWrite_ = false;
    link_->wantWritable(false);
  }
  if (delegate_) {
    for (uint32_t seq : revokedSeqs) {
      OutFrame note;
      note.seq = seq;
      note.revoked = true;
      delegate_->onPayloadRevoked(*this, note);
      if (closed()) return;
    }
  }
  if (out_.empty() && closeAfterFlush_) {
    if (drainOnClose_) {
      startDrain();
    } else {
      close(Status::ok(), true);
    }
  }
}

bool Conn::addFromDeviceLocked(IovBuilder& out, const Segment& seg) {
  if (out.skip >= seg.length) {
    out.skip -= seg.length;
    return true;
  }
  if (!outStaged_) {
    outStaged_ = std::make_unique<uint8_t[]>(kStagingBytes);
    outPinned_ = cuda::PinnedHost(outStaged_.get(), kStagingBytes);
  }
  const size_t from = out.skip;
  const size_t n = std::min(kStagingBytes - outStagedUsed_, seg.length - from);
  if (n == 0) {
    out.stopped = true;  // the next write copies it
    return true;
  }
  uint8_t* at = outStaged_.get() + outStagedUsed_;
  if (!readRegion(*seg.entry, at, seg.ptr + from, n)) return false;
  outStagedUsed_ += n;
  out.skip = 0;
  out.iov[out.count++] = {at, n};
  if (n < seg.length - from) out.stopped = true;
  return true;
}

void Conn::gatherLocked(IovBuilder& out, std::vector<uint32_t>* revokedSeqs) {
  outStagedUsed_ = 0;  // the last write took what it held (the link copies what it writes)
  for (auto& frame : out_) {
    if (out.full()) break;
    out.skip = frame.sent;
    out.add(frame.header, frame.headerLen);
    if (!frame.ownedPayload.empty()) out.add(frame.ownedPayload.data(), frame.ownedPayload.size());
    for (auto& seg : frame.payload) {
      if (out.full()) break;
      const bool gone = seg.entry && seg.entry->revoked;
      if (!gone && !onDevice(seg)) {
        out.add(seg.ptr, seg.length);
        continue;
      }
      if (!gone && addFromDeviceLocked(out, seg)) continue;
      if (!frame.revoked) {
        frame.revoked = true;
        revokedSeqs->push_back(frame.seq);
      }
      // Never read a deregistered region (or device memory the driver no longer copies): its
      // bytes go out as zeros.
      if (!out.addZeros(seg.length)) break;
    }
    if (frame.hasTrailer && !out.full()) {
      frame.trailer = frame.revoked ? static_cast<uint32_t>(wire::Syndrome::kRemAccess) : frame.trailer;
      static_assert(sizeof(frame.trailer) == 4);
      out.add(reinterpret_cast<const uint8_t*>(&frame.trailer), 4);
    }
    if (out.skip > 0) break;  // the frame did not fit in iov; later frames must wait
  }
}

void Conn::consumeSent(size_t n) {
  while (!out_.empty()) {
    const size_t remaining = out_.front().total() - out_.front().sent;
    if (n < remaining) {
      out_.front().sent += n;
      return;
    }
    n -= remaining;
    out_.pop_front();
  }
}

void Conn::awaitWhatIsLeft() {
  // Set at every stop, never left from an earlier one: a mark from an earlier wait (the rest of a
  // payload since taken) could exceed every byte still to come, and they would never wake us.
  const bool direct = directReadPossible();
  // A payload read straight into place: nothing to do until the rest of it is here. A header (or a
  // small payload) may be any size: wake for any byte.
  link_->awaitBytes(direct ? payloadLeft_ : 0);
}

void Conn::onReadable() {
  auto self = shared_from_this();
  if (draining_) return discardWhileDraining();
  for (;;) {
    cork();
    int round = 0;
    for (; round < 64 && !closed() && !paused_; ++round) {
      const ReadStep step = directReadPossible() ? readDirectStep() : ReadStep::kStaged;
      if (step == ReadStep::kMore) continue;
      if (step == ReadStep::kWait) break;
      if (step == ReadStep::kStop) return;
      const ReadStep staged = readStagedStep();
      if (staged == ReadStep::kWait) break;
      if (staged == ReadStep::kStop) return;
    }
    if (!closed() && delegate_) delegate_->onInputDrained(*this);
    if (closed()) return;
    uncork();                         // what the input caused goes out now, before any wait
    if (closed() || paused_) return;  // a paused connection reads again when resumed
    if (round >= 64) {
      // Yield to the reactor's other work; the link brings us back for the rest.
      awaitWhatIsLeft();
      link_->resumeReadingLater();
      return;
    }
    // Nothing more to read: poll briefly (a link that can), then wait to be told.
    if (!link_->prepareToSleep()) return;
  }
}

void Conn::discardWhileDraining() {
  // Closing: discard whatever arrives until the peer closes its side (a bounded amount at a
  // time, so a peer that keeps writing cannot hold the progress thread).
  for (int i = 0;; ++i) {
    if (i == 64) {
      link_->resumeReadingLater();
      return;
    }
    ssize_t n = link_->read(staged_.get(), kStagingBytes);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (link_->prepareToSleep()) continue;
      return;
    }
    close(Status::ok(), true);
    return;
  }
}

bool Conn::directReadPossible() const {
  return inState_ == InState::kPayload && stagedBegin_ == stagedEnd_ && payloadLeft_ >= kDirectReadMin &&
         segIndex_ < plan_.segments.size() && !onDevice(plan_.segments[segIndex_]);
}

Conn::ReadStep Conn::readDirectStep() {
  ssize_t n = readDirect();
  if (n > 0) {
    reactor_->noteWork(static_cast<size_t>(n));
    if (delegate_) delegate_->onProgress(*this);
    if (payloadLeft_ == 0) finishPayload();
    return ReadStep::kMore;
  }
  if (n == -2) return ReadStep::kStaged;  // the destination is gone: the staged path discards
  return readEnded(n);
}

Conn::ReadStep Conn::readEnded(ssize_t n) {
  if (n == 0) {
    close(Status(StatusCode::kUnavailable, "the peer closed the connection", ECONNRESET));
    return ReadStep::kStop;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    awaitWhatIsLeft();
    return ReadStep::kWait;
  }
  if (errno == EINTR) return ReadStep::kMore;
  close(ioError("recv"));
  return ReadStep::kStop;
}

Conn::ReadStep Conn::readStagedStep() {
  if (stagedBegin_ == stagedEnd_) {
    stagedBegin_ = stagedEnd_ = 0;
  } else if (stagedBegin_ > kStagingBytes / 2) {
    std::memmove(staged_.get(), staged_.get() + stagedBegin_, stagedEnd_ - stagedBegin_);
    stagedEnd_ -= stagedBegin_;
    stagedBegin_ = 0;
  }
  // After a large payload the next frame is likely large too: a small read takes its header and
  // the direct read above its payload. After small ones, a read takes as many as fit.
  const size_t room = kStagingBytes - stagedEnd_;
  ssize_t n =
      link_->read(staged_.get() + stagedEnd_, lastPayloadDirect_ ? std::min(room, kHeaderWindowBytes) : room);
  if (n > 0) {
    stagedEnd_ += static_cast<size_t>(n);
    reactor_->noteWork(static_cast<size_t>(n));
    if (delegate_) delegate_->onProgress(*this);
    return consumeStaged() ? ReadStep::kMore : ReadStep::kStop;
  }
  return readEnded(n);
}

ssize_t Conn::readDirect() {
  iovec iov[kMaxIov];
  int count = 0;
  size_t want = 0;
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
  size_t idx = segIndex_;
  size_t off = segOffset_;
  while (idx < plan_.segments.size() && count < kMaxIov && want < payloadLeft_) {
    const Segment& seg = plan_.segments[idx];
    if ((seg.entry && seg.entry->revoked) || onDevice(seg)) break;  // staged instead
    size_t len = std::min(seg.length - off, payloadLeft_ - want);
    if (len > 0) iov[count++] = {seg.ptr + off, len};
    want += len;
    ++idx;
    off = 0;
  }
  if (count == 0) return -2;
  ssize_t n = link_->readv(iov, count);
  if (n <= 0) return n;
  size_t got = static_cast<size_t>(n);
  payloadLeft_ -= got;
  while (got > 0) {
    size_t room = plan_.segments[segIndex_].length - segOffset_;
    if (got >= room) {
      got -= room;
      ++segIndex_;
      segOffset_ = 0;
    } else {
      segOffset_ += got;
      got = 0;
    }
  }
  return n;
}

size_t Conn::placeFromBuffer(const uint8_t* src, size_t len) {
  size_t taken = 0;
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu(), std::defer_lock);
  if (segIndex_ < plan_.segments.size()) memLock.lock();
  while (taken < len && segIndex_ < plan_.segments.size()) {
    Segment& seg = plan_.segments[segIndex_];
    size_t piece = std::min(seg.length - segOffset_, len - taken);
    if (onDevice(seg) && !inPinTried_) {
      inPinTried_ = true;  // once: the device copies from the input staging buffer from now on
      inPinned_ = cuda::PinnedHost(staged_.get(), kStagingBytes);
    }
    if (!seg.entry) {
      DeviceAccess device;  // ferry's own buffer
      std::memcpy(seg.ptr + segOffset_, src + taken, piece);
    } else if (seg.entry->revoked || !writeRegion(*seg.entry, seg.ptr + segOffset_, src + taken, piece)) {
      plan_.revoked = true;  // deregistered while the message arrived (or its device lost): discard
    }
    taken += piece;
    segOffset_ += piece;
    if (segOffset_ == seg.length) {
      ++segIndex_;
      segOffset_ = 0;
    }
  }
  return len;  // bytes beyond the plan are discarded
}

void Conn::beginFrame() {
  plan_ = PayloadPlan{};
  segIndex_ = 0;
  segOffset_ = 0;
  trailerHave_ = 0;
  Status st = delegate_ ? delegate_->onHeader(*this, header_, &plan_)
                        : Status(StatusCode::kProtocolError, "no handler for this connection");
  if (!st.isOk()) {
    FERRY_LOG(kWarn, "closing a connection: %s", st.toString().c_str());
    close(st);
    return;
  }
  if (paused_) {
    headerPending_ = true;  // the delegate cannot place this frame yet: asked again on resume
    plan_ = PayloadPlan{};
    return;
  }
  // A plan never covers more than the payload.
  size_t covered = 0;
  for (size_t i = 0; i < plan_.segments.size(); ++i) {
    if (covered + plan_.segments[i].length >= header_.payloadLen) {
      plan_.segments[i].length = header_.payloadLen - covered;
      plan_.segments.resize(i + 1);
      break;
    }
    covered += plan_.segments[i].length;
  }
  payloadLeft_ = header_.payloadLen;
  inState_ = InState::kPayload;
  if (payloadLeft_ == 0) finishPayload();
}

void Conn::finishPayload() {
  if (wire::trailerLen(header_.type) > 0 && trailerHave_ < 4) {
    inState_ = InState::kTrailer;
    return;
  }
  uint32_t trailer = 0;
  if (wire::trailerLen(header_.type) > 0) {
    trailer = static_cast<uint32_t>(trailerBuf_[0]) | (static_cast<uint32_t>(trailerBuf_[1]) << 8) |
              (static_cast<uint32_t>(trailerBuf_[2]) << 16) | (static_cast<uint32_t>(trailerBuf_[3]) << 24);
  }
  inState_ = InState::kHeader;
  headerHave_ = 0;
  headerNeed_ = wire::kCommonHeaderLen;
  trailerHave_ = 0;
  lastPayloadDirect_ = header_.payloadLen >= kDirectReadMin;
  PayloadPlan plan = std::move(plan_);
  plan_ = PayloadPlan{};
  wire::FrameHeader header = header_;
  if (delegate_) delegate_->onFrame(*this, header, plan, trailer);
}

bool Conn::consumeStaged() {
  while (stagedBegin_ < stagedEnd_ && !closed() && !paused_) {
    size_t avail = stagedEnd_ - stagedBegin_;
    const uint8_t* src = staged_.get() + stagedBegin_;
    switch (inState_) {
      case InState::kHeader: {
        size_t take = std::min(headerNeed_ - headerHave_, avail);
        std::memcpy(headerBuf_ + headerHave_, src, take);
        headerHave_ += take;
        stagedBegin_ += take;
        if (headerHave_ < headerNeed_) break;
        if (headerNeed_ == wire::kCommonHeaderLen) {
          auto len = wire::peekHeaderLen(std::span<const uint8_t>(headerBuf_, headerHave_));
          if (!len.isOk()) {
            FERRY_LOG(kWarn, "closing a connection: %s", len.status().toString().c_str());
            close(len.status());
            return false;
          }
          headerNeed_ = *len;
          if (headerHave_ < headerNeed_) break;
        }
        Status st = wire::decodeHeader(std::span<const uint8_t>(headerBuf_, headerNeed_), &header_);
        if (!st.isOk()) {
          FERRY_LOG(kWarn, "closing a connection: %s", st.toString().c_str());
          close(st);
          return false;
        }
        beginFrame();
        break;
      }
      case InState::kPayload: {
        size_t take = std::min(avail, payloadLeft_);
        if (header_.payloadLen >= kDirectReadMin) largeStagedCount.fetch_add(take, std::memory_order_relaxed);
        placeFromBuffer(src, take);
        stagedBegin_ += take;
        payloadLeft_ -= take;
        if (payloadLeft_ == 0) finishPayload();
        break;
      }
      case InState::kTrailer: {
        size_t take = std::min<size_t>(4 - trailerHave_, avail);
        std::memcpy(trailerBuf_ + trailerHave_, src, take);
        trailerHave_ += take;
        stagedBegin_ += take;
        if (trailerHave_ == 4) finishPayload();
        break;
      }
    }
  }
  return !closed();
}

}  // namespace ferry::soft
