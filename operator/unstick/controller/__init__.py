"""unstick.controller"""
