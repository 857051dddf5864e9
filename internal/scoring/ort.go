package scoring

import (
	"errors"
	"fmt"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
)

// InitORT resolves ORT_LIB as config.ResolvePath does and starts the one ONNX
// Runtime environment of the process; every command that scores (run, score,
// bench, compare) starts it this way, so a missing library reads alike.
func InitORT(ortLib string) (shutdown func() error, err error) {
	if ortLib == "" {
		return nil, errors.New("ORT_LIB is not set and the scorer executable's folder, where its default lies, is unknown: point ORT_LIB at libonnxruntime.so.1")
	}
	lib, err := config.ResolvePath(ortLib)
	if err != nil {
		return nil, fmt.Errorf("ORT_LIB: %w (run `make` to fetch ONNX Runtime, or point ORT_LIB at libonnxruntime.so.1)", err)
	}
	return ortenv.InitRuntime(lib)
}

// LoadModel loads MODEL_DIR with the scoring options from cfg.
func LoadModel(cfg config.Config) (*model.Model, error) {
	lo, err := cfg.ModelOptions()
	if err != nil {
		return nil, err
	}
	return model.Load(lo)
}
