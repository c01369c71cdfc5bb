"""What the tabs show of a draft and the workers, in words and charts (views, charts), and what one browser tab
has read of a draft (live). No Gradio components, no other room of ui."""
