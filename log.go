package redislock

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"time"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/redislock/redislock/internal/store"
)

// WithLogger sets the logger of a lock's lines, or of a Locker's and its
// locks'. Without it a lock logs through its Locker's logger, and a Locker
// through its store's: go-zero's logx for go-zero's *redis.Redis,
// slog.Default() (as it is at each line) for others. Lines are
// structured: a short message, and the key, owner, kind, token and cause
// as attributes. Their levels: Warn for a lost hold, a failed renewal or
// release; Error for what Redis refused that the locks need (a wake-up, a
// subscription); Debug for what follows the application's own ending of a
// hold, a context, its client or the Locker.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// logxLogger writes through go-zero's logx.
var logxLogger = slog.New(logxHandler{})

// logger returns the logger of the Locker's own lines.
func (l *Locker) logger() *slog.Logger {
	if l.log != nil {
		return l.log
	}
	return slog.Default()
}

// logger returns the logger of rl's lines.
func (rl *RedisLock) logger() *slog.Logger {
	if rl.opts.logger != nil {
		return rl.opts.logger
	}
	return rl.locker.logger()
}

// kind names the kind of rl in its lines.
func (rl *RedisLock) kind() string {
	switch {
	case rl.opts.shared:
		return "shared"
	case rl.opts.permits > 0:
		return "permit"
	case rl.opts.fair:
		return "fair"
	}
	return "lock"
}

// logHold logs msg at level about hold h (nil: none) of rl, with attrs,
// as said by logHold's caller.
func (rl *RedisLock) logHold(level slog.Level, msg string, h *hold, attrs ...slog.Attr) {
	log := rl.logger()
	ctx := context.Background()
	if !log.Enabled(ctx, level) {
		return
	}
	var pc [1]uintptr
	runtime.Callers(2, pc[:]) // the caller's line, not this one's
	r := slog.NewRecord(time.Now(), level, msg, pc[0])
	r.AddAttrs(slog.String("key", rl.key), slog.String("kind", rl.kind()))
	if h != nil {
		r.AddAttrs(slog.String("owner", h.id))
		if h.token != 0 {
			r.AddAttrs(slog.Int64("token", h.token))
		}
	}
	r.AddAttrs(attrs...)
	_ = log.Handler().Handle(ctx, r)
}

// causeAttr is the attribute of an error.
func causeAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("cause", bare(err))
}

// closedLevel is the level of a failure: Debug when it follows the
// application's own Close of its client or of the Locker, else level.
func (l *Locker) closedLevel(err error, level slog.Level) slog.Level {
	if store.Closed(err) || errors.Is(err, ErrLockerClosed) || l.isClosed() {
		return slog.LevelDebug
	}
	return level
}

// callerSkip returns how many callers up from Handle's the frame of pc
// is: logx's caller skip, for logx to name the line that logged.
func callerSkip(pc uintptr) int {
	var pcs [32]uintptr
	n := runtime.Callers(3, pcs[:]) // from the caller of Handle
	for i, p := range pcs[:n] {
		if p == pc {
			return i + 1
		}
	}
	return 1
}

// logxHandler is a slog.Handler that writes through go-zero's logx, so
// that a go-zero service's lines stay in its log. logx has no warning
// level: Warn and above are logged as errors, Info as info, below as
// debug. logx filters by its own level.
type logxHandler struct {
	fields []logx.LogField
	group  string
}

func (logxHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logxHandler) Handle(ctx context.Context, r slog.Record) error {
	fields := append(make([]logx.LogField, 0, len(h.fields)+r.NumAttrs()), h.fields...)
	r.Attrs(func(a slog.Attr) bool {
		fields = h.add(fields, h.group, a)
		return true
	})
	log := logx.WithContext(ctx).WithCallerSkip(callerSkip(r.PC))
	switch {
	case r.Level >= slog.LevelWarn:
		log.Errorw(r.Message, fields...)
	case r.Level >= slog.LevelInfo:
		log.Infow(r.Message, fields...)
	default:
		log.Debugw(r.Message, fields...)
	}
	return nil
}

func (h logxHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	fields := append([]logx.LogField(nil), h.fields...)
	for _, a := range attrs {
		fields = h.add(fields, h.group, a)
	}
	return logxHandler{fields: fields, group: h.group}
}

func (h logxHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return logxHandler{fields: h.fields, group: h.group + name + "."}
}

// add appends a as fields, its key after prefix (a group's attributes
// one each).
func (logxHandler) add(fields []logx.LogField, prefix string, a slog.Attr) []logx.LogField {
	v := a.Value.Resolve()
	switch {
	case a.Equal(slog.Attr{}):
		return fields
	case v.Kind() == slog.KindGroup:
		if a.Key != "" {
			prefix += a.Key + "."
		}
		for _, g := range v.Group() {
			fields = logxHandler{}.add(fields, prefix, g)
		}
		return fields
	}
	return append(fields, logx.Field(prefix+a.Key, v.Any()))
}
