// Conn: one connection of the soft provider, framed by wire.h, driven by the reactor's loop. Its
// bytes go over a Link (link.h): a TCP socket, or between processes of one host a pair of
// shared-memory rings. Conn holds no transport of its own: it frames, places and paces, the same
// over either.
//
// Input: headers are read into a staging buffer; a payload goes straight into its destination
// (registered memory) — copied from the staging buffer for the bytes already read with the header,
// read from the link directly into place for the rest. Output: frames are queued and written
// with writev straight from registered memory. Registered memory on a CUDA device is never read
// or written in place: input for it goes through the staging buffer and is copied to the device a
// buffer at a time, output is copied from it into a buffer of its own a write at a time
// (region_copy.h). Every touch of registered memory happens under the
// context's memory lock (shared) after checking the region was not deregistered; a region that was
// is never touched again: incoming bytes meant for it are discarded and outgoing bytes from it are
// replaced by zeros, and the frame is marked so the QP can report the error.
#pragma once

#include <sys/uio.h>

#include <memory>
#include <vector>

#include "common/cuda_driver.h"
#include "common/ring_deque.h"
#include "providers/soft/link.h"
#include "providers/soft/soft.h"
#include "providers/soft/wire.h"

namespace ferry::soft {

// Where the payload of an incoming frame goes.
struct PayloadPlan {
  Segments segments;     // empty: discard the payload
  bool revoked = false;  // a destination region was deregistered while bytes arrived
};

struct OutFrame {
  OutFrame() = default;
  // Moves and copies take the header's headerLen bytes, not the whole buffer (an implicit move
  // copies all of it, byte by byte as compiled here, at every queueing of a frame).
  OutFrame(OutFrame&& o) noexcept { *this = std::move(o); }
  OutFrame& operator=(OutFrame&& o) noexcept;
  OutFrame(const OutFrame& o) { *this = o; }
  OutFrame& operator=(const OutFrame& o);

  uint8_t header[wire::kMaxHeaderLen];
  uint16_t headerLen = 0;
  Segments payload;                   // from registered memory (checked at each write)
  std::vector<uint8_t> ownedPayload;  // or bytes ferry owns (inline data)
  bool hasTrailer = false;
  uint32_t trailer = 0;  // READ_RESP status; becomes kRemAccess if payload was revoked
  bool revoked = false;  // a payload region was deregistered while being sent
  uint32_t seq = 0;
  // Progress.
  size_t sent = 0;
  size_t total() const;

 private:
  template <typename Other>
  void assignFrom(Other&& o);  // a copy or a move (Other: const OutFrame& or OutFrame)
};

struct IovBuilder;  // conn.cc: the iovec of one write

class Conn : public std::enable_shared_from_this<Conn>, public Link::Events {
 public:
  class Delegate {
   public:
    virtual ~Delegate() = default;
    // A frame header arrived; fill plan with the payload's destination (leave empty to discard).
    // Returning an error closes the connection (a protocol violation).
    virtual Status onHeader(Conn& conn, const wire::FrameHeader& header, PayloadPlan* plan) = 0;
    // The whole frame (payload and trailer) arrived.
    virtual void onFrame(Conn& conn, const wire::FrameHeader& header, const PayloadPlan& plan,
                         uint32_t trailer) = 0;
    // Everything readable was consumed, or input paused (a good moment to send a coalesced
    // acknowledgement).
    virtual void onInputDrained(Conn& conn) {}
    // A queued frame lost payload bytes to a deregistration (they went out as zeros).
    virtual void onPayloadRevoked(Conn& conn, const OutFrame& frame) {}
    // Bytes moved in either direction (for the transport timeout).
    virtual void onProgress(Conn& conn) {}
    // The connection finished connecting (outgoing connections).
    virtual void onConnected(Conn& conn) {}
    // The connection is closed; why says what happened (kOk for an orderly local close).
    virtual void onClosed(Conn& conn, const Status& why) = 0;
  };

  // An outgoing connection whose link is still connecting (Link::connecting) says onConnected
  // once it is connected, and holds the frames sent before then.
  // A connection runs on the context's loop, or on `reactor` when given (a stripe's sending side,
  // on a thread of its own: its delegate must then not touch the QP directly).
  Conn(SoftContext* ctx, std::unique_ptr<Link> link, Delegate* delegate, Reactor* reactor = nullptr);
  ~Conn() override;

  // Registers with the reactor (reactor thread).
  Status attach();
  // Hands an attached connection over to another loop: called on its loop between steps, with its
  // input paused and no close under way. The link stops being watched here at once and is watched
  // on `to` from the first task `to` runs, which also resumes the input; everything from then on
  // (the delegate's calls too) happens on `to`. TCP links only (a ring's may be polled by the
  // application's calls, which run this loop).
  void moveTo(Reactor* to);
  void setDelegate(Delegate* delegate) { delegate_ = delegate; }
  // Queues a frame and writes what the link takes now (unless corked).
  void send(OutFrame frame);
  // Corked, frames are only queued; the last uncork() writes them all at once (one system call for
  // many frames instead of one each). Nests. While the connection reads, it is corked: the frames
  // its input causes (acknowledgements, READ responses) go out together when the input is drained.
  void cork() { ++corks_; }
  void uncork();
  // Sends a frame with only a header.
  void sendHeader(const wire::FrameHeader& header);
  // Closes at once (queued output is dropped). Calls onClosed(why) unless quiet.
  void close(const Status& why, bool quiet = false);
  // Closes once the queued output is written. With drain, it then half-closes (FIN) and discards
  // what the peer still sends until the peer closes too, so the peer reads everything queued before (a
  // close with unread input would reset the connection and lose it). The connection keeps itself
  // until then, for kCloseAfterFlushLimit (5 s) at most, flushing and draining together: its owner
  // may let it go at once.
  void closeAfterFlush(bool drain = false);
  bool closed() const { return closed_; }
  // The byte stream under this connection (which kind, whose address).
  const Link& link() const { return *link_; }
  // For a link the application's polls may take (Link::pollable): our application polls until
  // untilNs (Link::attend), and a poll of its own takes what the link holds, as the progress
  // thread's wake-up would (loop only; whether it held any). A poll that finds the link empty
  // still tells it so (Link::prepareToSleep): a ring drained under a lease is left awake for its
  // producer, and the first poll after the lease's end (the thread's sweep) must put it to sleep.
  void attend(int64_t untilNs);
  bool pollInput();
  bool connected() const { return !link_->connecting() && !closed_; }
  // Drops queued frames that have not started to go out.
  void dropUnsentFrames();
  // Input stops at the end of the current step: called from onHeader, the frame waits (its
  // onHeader comes again on resume, before its payload); from onFrame, the frames after it wait.
  // Nothing more is read meanwhile (the link stops watching for input: TCP links only).
  // resumeInput() goes on from the loop soon after (never from inside the caller's step).
  void pauseInput();
  void resumeInput();
  size_t queuedFrames() const { return out_.size(); }

 private:
  // Link::Events.
  void onLinkConnected(const Status& result) override;
  void onLinkReadable() override;
  void onLinkWritable() override;
  void onLinkBroken(const Status& why) override;

  void onReadable();
  // onReadable's steps: what arrives while closing, discarded; one read straight into the payload's
  // place, or into the staging buffer and consumed. kMore: read on; kWait: nothing more now (the
  // link is told what to wake for); kStop: the connection closed or its owner stopped it;
  // kStaged: read through the staging buffer instead.
  enum class ReadStep { kMore, kWait, kStop, kStaged };
  void discardWhileDraining();
  bool directReadPossible() const;
  ReadStep readDirectStep();
  ReadStep readStagedStep();
  ReadStep readEnded(ssize_t n);  // a read that took nothing (n <= 0): closed, wait, or again
  void flush();
  // flush's steps: the iovec of the frames waiting (their sent bytes left out; a deregistered
  // region's bytes as zeros, its frame's seq noted), taken under the memory lock; n bytes written
  // taken off the frames.
  void gatherLocked(IovBuilder& out, std::vector<uint32_t>* revokedSeqs);
  // A segment of device memory goes out through the output staging buffer, as much of it as the
  // buffer has room for in this write (the rest in the next); false: the driver refused the copy.
  bool addFromDeviceLocked(IovBuilder& out, const Segment& seg);
  void consumeSent(size_t n);
  // Consumes staged bytes: headers, payload copies, trailers.
  bool consumeStaged();
  void finishPayload();
  void beginFrame();
  // Copies up to len bytes from src into the current plan's destinations; returns bytes taken.
  size_t placeFromBuffer(const uint8_t* src, size_t len);
  ssize_t readDirect();
  // Tells the link how many bytes this side now needs before it can do anything (Link::awaitBytes).
  void awaitWhatIsLeft();
  // What the input lets us read, then what it caused sent.
  void takeInput();
  void detachLink();

  // Picks up where pauseInput() stopped (loop).
  void continueAfterPause();

  SoftContext* ctx_;
  Reactor* reactor_;
  std::unique_ptr<Link> link_;
  bool paused_ = false;
  bool headerPending_ = false;  // paused in onHeader: the header is asked about again on resume
  bool closed_ = false;
  Delegate* delegate_;
  bool closeAfterFlush_ = false;
  bool drainOnClose_ = false;
  bool draining_ = false;
  // From closeAfterFlush: the timer that closes us at the latest after kCloseAfterFlushLimit,
  // flushing and draining together. It holds us (the owner may let us go at once); close()
  // cancels it, a stopped loop drops it.
  static constexpr std::chrono::seconds kCloseAfterFlushLimit{5};
  Reactor::TimerId closeTimer_ = 0;
  void startDrain();
  bool wantWrite_ = false;
  int corks_ = 0;

  // Input state.
  enum class InState { kHeader, kPayload, kTrailer };
  InState inState_ = InState::kHeader;
  // Not zero-filled: the kernel maps a page of it only when input first lands there, so an idle
  // or message-only connection holds a few pages, not the whole buffer.
  std::unique_ptr<uint8_t[]> staged_;
  size_t stagedBegin_ = 0;
  size_t stagedEnd_ = 0;
  // The last frame's payload was read straight into place: the next header is read in a small
  // window, so that the next large payload is not staged (and copied again) a quarter MiB at a time.
  bool lastPayloadDirect_ = false;
  uint8_t headerBuf_[wire::kMaxHeaderLen];
  size_t headerHave_ = 0;
  size_t headerNeed_ = wire::kCommonHeaderLen;
  wire::FrameHeader header_;
  PayloadPlan plan_;
  size_t payloadLeft_ = 0;
  size_t segIndex_ = 0;
  size_t segOffset_ = 0;
  uint8_t trailerBuf_[4];
  size_t trailerHave_ = 0;

  // Output state.
  RingDeque<OutFrame> out_;
  // Bytes of device memory copied out for the write under way (made at the first such segment).
  std::unique_ptr<uint8_t[]> outStaged_;
  size_t outStagedUsed_ = 0;
  // The staging buffers pinned for the device's copies, once device memory passes through them
  // (declared after them: unpinned before they are freed).
  cuda::PinnedHost outPinned_;
  cuda::PinnedHost inPinned_;
  bool inPinTried_ = false;
};

}  // namespace ferry::soft
