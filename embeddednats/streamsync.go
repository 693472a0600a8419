package embeddednats

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ErrNoStreamFiles reports a stream StreamSync cannot find on this server's disk.
var ErrNoStreamFiles = errors.New("embeddednats: stream files not found")

// ErrUnsyncable reports a stream that acknowledges writes before they reach its files
// (in memory, replicated, or in an asynchronous persist mode), so that fsyncing the
// files after an acknowledgement would not make the write durable.
var ErrUnsyncable = errors.New("embeddednats: the stream acknowledges writes before they reach its files")

// The stream's directories under its account's, as nats-server names them
// (server/filestore.go streamsDir, msgDir, blkSuffix; unexported there).
// TestAcknowledgedWriteIsInItsBlock fails if a server upgrade moves them or stops
// writing a message to them before acknowledging it.
const (
	streamsDir = "streams"
	msgsDir    = "msgs"
	blkSuffix  = ".blk"
)

// StreamSync makes one stream's stored messages durable: Sync fsyncs its message
// files. It is group commit on the embedded server. With JetStream's SyncAlways every
// publish pays an fsync of its own; without it, a single server's file store still
// writes each message to the kernel before acknowledging it (it flushes in place
// unless replicated or in the asynchronous persist mode, which Sync refuses), so one
// fsync after a group of acknowledgements makes all of them durable. The caller
// answers for those writes only after Sync returns.
//
// It finds the files from what the server says of them: its store directory
// (JetStreamConfig), the account's directory (Jsz), and the stream's own record in
// that directory (server.JetStreamMetaFile), which must name the stream and a
// configuration that flushes in place; only the names of the message directory and
// blocks inside it are nats-server's private layout, which a test pins.
//
// It covers the message blocks JetStream appends to. nats-server's background
// compaction of older blocks is synced on the server's own interval, as in its default
// mode (a rename over the old file, which ext4 orders after the new file's data).
type StreamSync struct {
	ns     *server.Server
	nc     *nats.Conn
	stream string
	mu     sync.Mutex // guards the fields below
	dir    string     // the stream's msgs directory, once found
	synced uint64     // the newest block: those before it are synced
	broken error      // a sync that failed: every later one fails with it
}

// StreamSync returns a StreamSync for stream, which nc's account holds on this
// server. It looks for the stream's files on first Sync, so the stream may not exist
// yet.
func (s *Server) StreamSync(nc *nats.Conn, stream string) *StreamSync {
	return &StreamSync{ns: s.ns, nc: nc, stream: stream}
}

// Sync fsyncs every message written to the stream before it was called. Calls may
// overlap: the kernel commits overlapping fsyncs of one file together.
func (y *StreamSync) Sync() error {
	path, err := y.newest()
	if err != nil || path == "" {
		return err
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		// The block went (compacted away, or the stream was purged or made again): the
		// index may have started again, so look at every block.
		y.mu.Lock()
		defer y.mu.Unlock()
		return y.syncAll()
	}
	if err != nil {
		return y.fail(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return y.fail(err)
	}
	return nil
}

// newest returns the block JetStream appends to, once every block before it is
// synced: those made since the last call are synced here, with the directory, holding
// the lock so that no overlapping call returns before they are durable.
func (y *StreamSync) newest() (string, error) {
	y.mu.Lock()
	defer y.mu.Unlock()
	if y.broken != nil {
		return "", y.broken
	}
	if y.dir == "" {
		dir, err := y.find()
		if err != nil {
			return "", err
		}
		y.dir = dir
		return "", y.syncAll()
	}
	if y.synced == 0 {
		return "", y.syncAll() // no block yet
	}
	// Blocks written since are the ones after it: JetStream numbers new blocks one up.
	added := false
	for idx := y.synced + 1; ; idx++ {
		if _, err := os.Stat(y.block(idx)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if err := syncFile(y.block(y.synced)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", y.failed(err)
		}
		y.synced, added = idx, true
	}
	if added {
		if err := syncFile(y.dir); err != nil {
			return "", y.failed(err)
		}
	}
	return y.block(y.synced), nil
}

// syncAll fsyncs every block and the directory. It first reads the stream's record
// again: a stream deleted and made again may have been made with another persist mode.
// Called with y.mu held.
func (y *StreamSync) syncAll() error {
	ents, err := os.ReadDir(y.dir)
	if errors.Is(err, os.ErrNotExist) { // the stream was deleted: look for it again
		y.dir = ""
		return fmt.Errorf("%w: %w", ErrNoStreamFiles, err)
	}
	if err != nil {
		return y.failed(err)
	}
	if err := y.checkRecord(filepath.Dir(y.dir)); err != nil {
		y.dir = "" // look for it again, through the server, next time
		return err
	}
	var top uint64
	for _, e := range ents {
		idx, ok := blockIndex(e.Name())
		if !ok {
			continue
		}
		if err := syncFile(filepath.Join(y.dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return y.failed(err)
		}
		top = max(top, idx)
	}
	y.synced = top
	if err := syncFile(y.dir); err != nil {
		return y.failed(err)
	}
	return nil
}

// syncFile fsyncs the file or directory at path.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// fail is failed, taking the lock.
func (y *StreamSync) fail(err error) error {
	y.mu.Lock()
	defer y.mu.Unlock()
	return y.failed(err)
}

// failed wraps err and keeps it: every later Sync fails with it. After a failed fsync
// the kernel may have dropped the pages it could not write and marked them clean, so a
// later fsync that succeeds would not mean they are on disk (nats-server, too, stops
// writing a stream whose write failed until it restarts). Called with y.mu held.
func (y *StreamSync) failed(err error) error {
	y.broken = fmt.Errorf("embeddednats: sync stream %s: %w (writes since the last good sync may be lost: restart the server once its disk is repaired)", y.stream, err)
	return y.broken
}

func (y *StreamSync) block(idx uint64) string {
	return filepath.Join(y.dir, strconv.FormatUint(idx, 10)+blkSuffix)
}

// find locates the stream's msgs directory: under the server's JetStream store, in
// the account nc is bound to, once the server's account of the stream (Jsz) and its
// record on disk both say the stream writes each message in place before
// acknowledging it.
func (y *StreamSync) find() (string, error) {
	jsc := y.ns.JetStreamConfig()
	if jsc == nil {
		return "", fmt.Errorf("%w: JetStream is not enabled", ErrNoStreamFiles)
	}
	account, err := y.account()
	if err != nil {
		return "", err
	}
	accountDir, err := y.lookup(account)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(jsc.StoreDir, accountDir, streamsDir, y.stream)
	if err := y.checkRecord(dir); err != nil {
		return "", err
	}
	msgs := filepath.Join(dir, msgsDir)
	if _, err := os.Stat(msgs); err != nil {
		return "", fmt.Errorf("%w: stream %s in account %s: %w", ErrNoStreamFiles, y.stream, account, err)
	}
	return msgs, nil
}

// lookup asks the server (Jsz) for the stream in account: it must flush each write in
// place (flushesInPlace). It returns the account's directory name, as the server
// names it.
func (y *StreamSync) lookup(account string) (string, error) {
	jsz, err := y.ns.Jsz(&server.JSzOptions{Account: account, Streams: true, Config: true})
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoStreamFiles, err)
	}
	for _, a := range jsz.AccountDetails {
		for _, sd := range a.Streams {
			if sd.Name != y.stream || sd.Config == nil {
				continue
			}
			if err := flushesInPlace(*sd.Config); err != nil {
				return "", err
			}
			return a.Id, nil
		}
	}
	return "", fmt.Errorf("%w: no stream %s in account %s", ErrNoStreamFiles, y.stream, account)
}

// flushesInPlace makes sure a stream of cfg is a single server's file store in the
// default persist mode, which writes each message to the kernel before acknowledging
// it (nats-server's fileStore.fip): a replicated stream acknowledges writes it
// flushes later, and so does the asynchronous persist mode, so fsyncing their files
// would not cover them.
func flushesInPlace(cfg server.StreamConfig) error {
	if cfg.Storage != server.FileStorage || cfg.Replicas > 1 {
		return fmt.Errorf("%w: stream %s (%s, %d replicas) is not a single file store; sync it with the server's sync_interval: always",
			ErrUnsyncable, cfg.Name, cfg.Storage, cfg.Replicas)
	}
	if cfg.PersistMode != server.DefaultPersistMode {
		return fmt.Errorf("%w: stream %s has persist mode %s, which acknowledges a write before it is written; give it the default persist mode",
			ErrUnsyncable, cfg.Name, cfg.PersistMode)
	}
	return nil
}

// checkRecord reads the stream's own record in dir (server.JetStreamMetaFile, the
// file store's configuration as nats-server wrote it): it must name the stream and
// flush in place. An encrypted store's record is sealed (its key beside it,
// server.JetStreamMetaFileKey), and the server's word (lookup) has to do.
func (y *StreamSync) checkRecord(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, server.JetStreamMetaFile))
	if err != nil {
		return fmt.Errorf("%w: stream %s: %w", ErrNoStreamFiles, y.stream, err)
	}
	if _, err := os.Stat(filepath.Join(dir, server.JetStreamMetaFileKey)); err == nil {
		return nil
	}
	var rec server.FileStreamInfo
	if err := json.Unmarshal(data, &rec); err != nil {
		return fmt.Errorf("%w: stream %s: its record %s: %w", ErrNoStreamFiles, y.stream, server.JetStreamMetaFile, err)
	}
	if rec.Name != y.stream {
		return fmt.Errorf("%w: %s names stream %q, not %s", ErrNoStreamFiles, filepath.Join(dir, server.JetStreamMetaFile), rec.Name, y.stream)
	}
	return flushesInPlace(rec.StreamConfig)
}

// account names the account the server bound nc to.
func (y *StreamSync) account() (string, error) {
	cid, err := y.nc.GetClientID()
	if err != nil {
		return "", fmt.Errorf("%w: the connection's id: %w", ErrNoStreamFiles, err)
	}
	cz, err := y.ns.Connz(&server.ConnzOptions{CID: cid, Username: true})
	if err != nil || len(cz.Conns) != 1 {
		return "", fmt.Errorf("%w: connection %d not on this server (%v)", ErrNoStreamFiles, cid, err)
	}
	if a := cz.Conns[0].Account; a != "" {
		return a, nil
	}
	return server.DEFAULT_GLOBAL_ACCOUNT, nil
}

// blockIndex parses a message block's file name, N.blk.
func blockIndex(name string) (uint64, bool) {
	n, ok := strings.CutSuffix(name, blkSuffix)
	if !ok {
		return 0, false
	}
	idx, err := strconv.ParseUint(n, 10, 64)
	return idx, err == nil
}
